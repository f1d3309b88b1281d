"""Parked models in a real pool server over HTTP (docs/architecture.md, "Parked models"): an evicted model is
parked and its next request wakes it, faster in every phase the load report and /metrics split a load into;
a parked copy whose source changed, or whose process is gone, is not used (the model loads from its source);
--max-parked-models bounds what stays parked; the server's parked folder goes with it.

One server (three members, a budget that holds one, at most one parked) serves every test; each test makes
the state it checks, so their order does not matter.
"""

from __future__ import annotations

import os
import re
import signal
import time

import httpx
import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model_cache.engine_processes import EngineProcesses

from tests.server.http.server_process import ServerProcess, run_server
from tests.support.hf_models import make_hf_model_dir

KV_BYTES = 4 * 2**20


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parked")
    sources = {"a": "tiny", "b": "tiny", "hf": str(make_hf_model_dir("llama", tmp / "hf"))}
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=KV_BYTES))
    footprints = [engines.footprint_bytes(s) for s in sources.values()]
    budget = max(footprints) + min(footprints) // 2  # one model at a time
    parked_dir = tmp / "parked"
    model_args = tuple(a for name, src in sources.items() for a in ("--model", f"{name}={src}"))
    with run_server("--memory-budget", str(budget), "--kv-cache-memory", str(KV_BYTES), "--min-residency-s", "0",
                    "--max-num-seqs", "2", "--max-model-len", "256", "--parked-memory", "2Gi",
                    "--max-parked-models", "1", "--parked-dir", str(parked_dir), tmp_path=tmp,
                    model_args=model_args) as server:
        server.sources = sources
        yield server
    assert list(parked_dir.iterdir()) == [], "the server left parked files behind"


def complete(server: ServerProcess, model: str) -> str:
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                   json={"model": model, "prompt": "one two three", "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def report(server: ServerProcess) -> dict:
    return {m["name"]: m for m in httpx.get(f"{server.base_url}/flotilla/v1/load", timeout=10).json()["models"]}


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in server.metrics().items() if n == name and all((k, x) in ls for k, x in labels.items()))


def parked_pid(server: ServerProcess, model: str) -> int:
    return int(re.findall(rf"model {model} parked in .*/{model}-(\d+)-\d+\.parked", server.log())[-1])


def test_an_evicted_model_is_parked_and_its_next_load_wakes_it_faster_in_every_phase(pool):
    first = complete(pool, "a")
    complete(pool, "b")  # evicts a: parked
    models = report(pool)
    disk = models["a"]["last_load"]
    assert models["a"]["state"] == "available" and models["a"]["parked_bytes"] > 0
    assert disk["origin"] == "disk" and disk["read_s"] > 0
    assert metric(pool, "flotilla_models_parked") == 1
    assert metric(pool, "flotilla_model_parked_bytes") == models["a"]["parked_bytes"]

    assert complete(pool, "a") == first  # the same tokens from the parked weights
    models = report(pool)
    woken = models["a"]["last_load"]
    assert woken["origin"] == "parked" and models["a"]["parked_bytes"] == 0 and models["b"]["parked_bytes"] > 0
    assert woken["seconds"] < disk["seconds"] and woken["read_s"] < disk["read_s"]
    assert woken["start_s"] < disk["start_s"]  # no fork
    for load in (disk, woken):  # the phases split the whole load
        phases = load["start_s"] + load["read_s"] + load["build_s"] + load["warmup_s"]
        assert phases == pytest.approx(load["seconds"], abs=1e-6)
    for phase in ("start", "read", "build", "warmup"):
        assert metric(pool, "flotilla_model_load_phase_seconds_count", phase=phase, origin="parked") >= 1
        assert metric(pool, "flotilla_model_load_phase_seconds_count", phase=phase, origin="disk") >= 1
    assert re.search(r"model a loaded in [\d.]+ s from parked \(start [\d.]+ s, read [\d.]+ s, build [\d.]+ s, "
                     r"warm-up [\d.]+ s;", pool.log())
    assert metric(pool, "flotilla_models_parked") == 1  # --max-parked-models 1: b, not both


def test_a_parked_copy_whose_source_changed_or_whose_process_is_gone_loads_from_disk(pool):
    complete(pool, "hf")
    complete(pool, "a")  # evicts hf: parked
    assert report(pool)["hf"]["parked_bytes"] > 0
    weights = os.path.join(pool.sources["hf"], "model.safetensors")
    os.utime(weights, ns=(time.time_ns(), time.time_ns()))  # the file changed since it was parked
    complete(pool, "hf")
    assert report(pool)["hf"]["last_load"]["origin"] == "disk"
    assert "its parked copy is not used (" + pool.sources["hf"] in pool.log()

    complete(pool, "b")  # evicts hf again: parked
    assert report(pool)["hf"]["parked_bytes"] > 0
    os.kill(parked_pid(pool, "hf"), signal.SIGKILL)  # an OOM kill, say
    time.sleep(0.2)
    complete(pool, "hf")
    assert report(pool)["hf"]["last_load"]["origin"] == "disk"
    assert re.search(r"model hf: its parked copy is not used \(its process \d+ is gone", pool.log())
