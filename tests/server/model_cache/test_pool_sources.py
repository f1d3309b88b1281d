"""A real multi-model server on 2 CPUs following a model list file: two entries of the real SmolLM2 GGUF under
different names and `tiny` (docs/serving.md, "Multi-model mode", "The model list file", "CPU threads").

What it shows: every source single-model mode loads is served here too, a GGUF included, sized from its
metadata; three resident engines on 2 usable CPUs step on their share (one thread), their steps of one row
included, as each step's thread count in /metrics says; a reload with a bad line is refused whole and one
with an unreadable source skips that line only, the others serving on, each refusal logged, counted and
shown in the load report; and a server that could not serve what it was given refuses to start, in one
line, exit 2. One server process serves every test that needs one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.cpu_quota import quota_cpus
from flotilla_server.model_cache.engine_processes import EngineProcesses
from prometheus_client.parser import text_string_to_metric_families

from tests.server.http.server_process import REPO, ServerProcess, run_server
from tests.server.model.gguf_reference import smollm2_gguf
from tests.support.ports import free_port

KV_BYTES = 16 * 2**20
ASK = [{"role": "user", "content": "What is the capital of France?"}]


def two_cpus() -> set[int]:
    """Two cores this process may run on: the server's usable CPUs, whatever the machine has."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or (quota_cpus() or 2) < 2:
        pytest.skip("needs 2 usable CPUs (cores and CPU quota)")
    return set(cores[:2])


def write(path: Path, text: str) -> None:
    """A new version of the list file, seen as changed even within one mtime tick."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool-sources")
    gguf = str(smollm2_gguf())
    members = {"smol-a": gguf, "smol-b": gguf, "demo": "tiny"}
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=KV_BYTES))
    budget = sum(engines.footprint_bytes(source) for source in members.values())  # all three resident at once
    listing = tmp / "models"
    listing.write_text("# the pool's members\n" + "".join(f"{n}={s}\n" for n, s in members.items()))
    with run_server("--memory-budget", str(budget), "--kv-cache-memory", str(KV_BYTES), "--max-model-len", "256",
                    "--max-num-seqs", "4", "--min-residency-s", "0", tmp_path=tmp, cpus=two_cpus(),
                    model_args=("--model-list-file", str(listing))) as server:
        server.listing, server.members = listing, members
        yield server


def chat(server: ServerProcess, model: str, max_tokens: int = 12, ignore_eos: bool = False) -> str:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=max_tokens, temperature=0,
                                           extra_body={"ignore_eos": ignore_eos})
    assert reply.model == model and reply.choices[0].finish_reason in ("stop", "length")
    return reply.choices[0].message.content


def samples(server: ServerProcess, name: str) -> list:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def load_report(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/flotilla/v1/load", timeout=10).json()


def served(server: ServerProcess) -> set[str]:
    return {m["id"] for m in httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]}


def wait_for(condition, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, "the server did not take the new list file"
        time.sleep(0.1)
    return value


def test_two_gguf_entries_under_different_names_both_serve(pool):
    for name in ("smol-a", "smol-b"):
        assert "Paris" in chat(pool, name)  # the real model, dequantized from the GGUF, under each name


def test_three_resident_engines_on_two_cpus_step_on_one_thread_each_small_steps_included(pool):
    for model in pool.members:  # one stream each: every decode step has one row
        chat(pool, model, max_tokens=16, ignore_eos=True)
    assert samples(pool, "flotilla_models_resident")[0].value == 3  # the budget holds all three
    for model in pool.members:
        mine = [s for s in samples(pool, "flotilla_step_threads_bucket") if s.labels["model"] == model]
        steps = next(s.value for s in mine if s.labels["le"] == "+Inf")
        on_one = next(s.value for s in mine if s.labels["le"] == "1.0")
        assert steps >= 16 and on_one == steps, f"{model}: {steps - on_one} of {steps} steps ran on more than 1 thread"


def test_a_reload_with_a_bad_line_is_refused_whole_and_the_list_before_serves_on(pool):
    good = pool.listing.read_text()
    write(pool.listing, good + "smol-c=/models/smol c\n")  # a second field after the source
    model_list = wait_for(lambda: load_report(pool)["model_list"]["reload_failures"] == 1
                          and load_report(pool)["model_list"])
    assert "line 5: 'c' follows source '/models/smol'" in model_list["last_error"]
    assert served(pool) == {"smol-a", "smol-b", "demo"}  # smol-c never joined; nobody left
    assert samples(pool, "flotilla_model_list_reload_failures_total")[0].value == 1
    assert "Paris" in chat(pool, "smol-a")
    assert "model list" in pool.log() and "refused, the models listed before stay" in pool.log()


def test_a_reload_with_an_unreadable_source_skips_that_line_and_the_others_serve_on(pool):
    gguf = pool.members["smol-a"]
    failures_before = load_report(pool)["model_list"]["reload_failures"]
    write(pool.listing, f"smol-a={gguf}\nsmol-b={gguf}\ndemo=tiny\nghost=/nowhere/ghost.gguf\nsmol-c={gguf}\n")
    wait_for(lambda: "smol-c" in served(pool))
    model_list = load_report(pool)["model_list"]
    assert model_list["last_error"] is None  # this version was read: a line it cannot serve is not a refusal
    assert model_list["reload_failures"] == failures_before
    assert [(s["name"], s["source"]) for s in model_list["skipped"]] == [("ghost", "/nowhere/ghost.gguf")]
    assert "GGUF file /nowhere/ghost.gguf not found" in model_list["skipped"][0]["error"]
    assert samples(pool, "flotilla_model_list_skipped")[0].value == 1
    assert "ghost" not in served(pool) and "model ghost is not served: GGUF file" in pool.log()
    assert "Paris" in chat(pool, "smol-b")
    refused = httpx.post(f"{pool.base_url}/v1/chat/completions", json={"model": "ghost", "messages": ASK}, timeout=10)
    assert refused.status_code == 404 and "is listed but not served: GGUF file" in refused.json()["error"]["message"]


def refuse_to_start(tmp_path: Path, *model_args: str) -> str:
    """The server's stderr, once it exited 2 without serving."""
    result = subprocess.run([sys.executable, "-m", "flotilla_server.cli", *model_args, "--host", "127.0.0.1",
                             "--port", str(free_port()), "--kv-cache-memory", str(KV_BYTES)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flotilla-server: error: "), result.stderr
    return lines[0]


def test_a_server_refuses_to_start_on_what_it_could_not_serve_in_one_line(tmp_path):
    gguf = str(smollm2_gguf())
    flag = refuse_to_start(tmp_path, "--model", f"a={gguf}", "--model", f"b={tmp_path}/b.gguf")
    assert re.search(r"--model b \(.*b\.gguf\): GGUF file .*b\.gguf not found", flag)
    bad_line = tmp_path / "bad-line"
    bad_line.write_text(f"a={gguf}\nb={gguf} extra\n")
    assert "line 2: 'extra' follows source" in refuse_to_start(tmp_path, "--model-list-file", str(bad_line))
    one_missing = tmp_path / "one-missing"
    one_missing.write_text(f"a={gguf}\nb={tmp_path}/b.gguf\n")
    missing = refuse_to_start(tmp_path, "--model-list-file", str(one_missing))
    assert re.search(r"error: --model-list-file's model b \(.*b\.gguf\): GGUF file .*b\.gguf not found", missing)
    nothing = tmp_path / "nothing-readable"
    nothing.write_text(f"a={tmp_path}/a.gguf\nb={tmp_path}\n")
    for mode in ("exit", "skip"):  # a pool's pods skip one member at start, but never start serving nothing
        assert "no model can be served: --model-list-file's model a" in refuse_to_start(
            tmp_path, "--model-list-file", str(nothing), "--unreadable-model-at-start", mode)
