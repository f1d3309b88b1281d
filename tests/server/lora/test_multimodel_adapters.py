"""LoRA adapters in multi-model mode, over a real server process: the model list file names each adapter's
base (`NAME=SOURCE base=BASE`); a request naming an adapter loads its base through the model cache and
answers as peft; the base answers as itself; /v1/models lists each adapter once with its base as `parent`;
the base's footprint counts its adapters; a line added at run time is served, a removed one 404s; a bad
adapter line refuses the start in one line naming it (docs/serving.md, "LoRA adapters")."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model.tokenizer import Tokenizer
from flotilla_server.model_cache.engine_processes import EngineProcesses

from tests.server.http.server_process import REPO, run_server
from tests.server.lora.test_engine_equality import peft_greedy
from tests.support.hf_models import hf_greedy, make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter
from tests.support.ports import free_port

MAX_TOKENS = 6
PROMPTS = random_prompts([9, 17], seed=21)
KV_BYTES = 2 * 2**20
SIZES = ("--kv-cache-memory", str(KV_BYTES), "--max-loras", "2", "--max-lora-rank", "16")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-pool")
    base = make_hf_model_dir("llama", root / "base")
    adapters = {"alpha": make_lora_adapter(base, root / "alpha", rank=8, seed=1),
                "beta": make_lora_adapter(base, root / "beta", rank=16, seed=2),
                "gamma": make_lora_adapter(base, root / "gamma", rank=4, seed=3)}
    tokenizer = Tokenizer.from_dir(base)

    def texts(answers: list[list[int]]) -> list[list[str]]:  # each token's text, as `logprobs.tokens` gives it
        return [[tokenizer.decode([t]) for t in tokens] for tokens in answers]

    expected = {"base": texts(hf_greedy(base, PROMPTS, MAX_TOKENS))}
    expected |= {name: texts(peft_greedy(base, path, PROMPTS, MAX_TOKENS)) for name, path in adapters.items()}
    list_file = root / "models"
    lines = [f"base={base}", f"alpha={adapters['alpha']} base=base", f"beta={adapters['beta']} base=base"]
    list_file.write_text("\n".join(lines) + "\n")
    with run_server(*SIZES, "--min-residency-s", "0", "--load-timeout-s", "120", tmp_path=root,
                    model_args=("--model-list-file", str(list_file))) as server:
        yield {"server": server, "base": base, "adapters": adapters, "expected": expected, "list_file": list_file,
               "lines": lines}


def complete(server, model: str, prompt) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", timeout=120, json={
        "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        "logprobs": 0})


def answers_as(server, model: str, expected: list[list[str]]) -> None:
    for prompt, want in zip(PROMPTS, expected, strict=True):
        reply = complete(server, model, prompt)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == model and reply.json()["choices"][0]["logprobs"]["tokens"] == want


def cards(server) -> dict[str, dict]:
    data = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]
    assert len({c["id"] for c in data}) == len(data)  # each once
    return {c["id"]: c for c in data}


def footprint(pool, adapters: tuple[str, ...]) -> int:
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=KV_BYTES, max_loras=2, max_lora_rank=16))
    return engines.footprint_bytes(str(pool["base"]), None, tuple((a, str(pool["adapters"][a])) for a in adapters))


def test_each_adapter_answers_as_peft_and_the_base_as_itself(pool):
    server = pool["server"]
    assert all(pool["expected"][a] != pool["expected"]["base"] for a in ("alpha", "beta"))  # each moves the answer
    listed = cards(server)
    assert {k: c.get("parent") for k, c in listed.items()} == {"base": None, "alpha": "base", "beta": "base"}
    assert listed["base"]["memory_bytes"] == footprint(pool, ("alpha", "beta")) > footprint(pool, ())
    answers_as(server, "alpha", pool["expected"]["alpha"])  # loads the base, with its adapters
    answers_as(server, "base", pool["expected"]["base"])
    answers_as(server, "beta", pool["expected"]["beta"])
    loaded = cards(server)
    assert loaded["base"]["state"] == "loaded" and loaded["alpha"]["state"] == "loaded"
    assert loaded["base"]["memory_bytes"] == footprint(pool, ("alpha", "beta"))  # held: as predicted


def test_a_line_added_at_run_time_is_served_and_a_removed_one_404s(pool):
    server = pool["server"]
    answers_as(server, "base", pool["expected"]["base"])  # the base is loaded
    time.sleep(0.05)  # a new modification time even on coarse clocks
    pool["list_file"].write_text("\n".join([pool["lines"][0], pool["lines"][1],
                                            f"gamma={pool['adapters']['gamma']} base=base"]) + "\n")
    deadline = time.monotonic() + 30
    while complete(server, "gamma", PROMPTS[0]).status_code != 200:  # once its engine has read it
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    answers_as(server, "gamma", pool["expected"]["gamma"])
    gone = complete(server, "beta", PROMPTS[0])
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert {k: c.get("parent") for k, c in cards(server).items()} == {"base": None, "alpha": "base", "gamma": "base"}
    assert "adapters beta unloaded, gamma loaded" in server.log()
    answers_as(server, "alpha", pool["expected"]["alpha"])


def test_a_bad_adapter_line_refuses_the_start_in_one_line(tmp_path, pool):
    bad = tmp_path / "models"
    bad.write_text(f"base={pool['base']}\nalpha={pool['adapters']['alpha']} base=nope\n")
    result = subprocess.run([sys.executable, "-m", "flotilla_server.cli", "--model-list-file", str(bad), *SIZES,
                             "--host", "127.0.0.1", "--port", str(free_port())],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"flotilla-server: error: {bad} line 2: adapter 'alpha' names base 'nope', which no line lists: "
                     "base= names a model line of the same file"], result.stderr
