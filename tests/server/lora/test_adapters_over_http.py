"""LoRA adapters over HTTP, on a real server process: a request names its adapter as `model` and gets peft's
greedy answer for it, the base's name gets the base's answer, /v1/models lists the adapters with the model as
their parent, an unknown name gets the 404 it always got, and an adapter that cannot be served refuses the
start in one line naming it (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from flotilla_server.model.tokenizer import Tokenizer

from tests.server.http.server_process import REPO, run_server
from tests.server.lora.test_engine_equality import peft_greedy
from tests.support.hf_models import hf_greedy, make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter

MAX_TOKENS = 6
PROMPTS = random_prompts([7, 19, 30], seed=11)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-http")
    base = make_hf_model_dir("llama", root / "base")
    adapters = {"alpha": make_lora_adapter(base, root / "alpha", rank=8, seed=1),
                "beta": make_lora_adapter(base, root / "beta", rank=16, seed=2)}
    tokenizer = Tokenizer.from_dir(base)
    def texts(answers: list[list[int]]) -> list[list[str]]:  # each token's text, as `logprobs.tokens` gives it
        return [[tokenizer.decode([t]) for t in tokens] for tokens in answers]

    expected = {"base": texts(hf_greedy(base, PROMPTS, MAX_TOKENS))}
    for name, path in adapters.items():
        expected[name] = texts(peft_greedy(base, path, PROMPTS, MAX_TOKENS))
    return root, base, adapters, expected


def complete(url: str, model: str, prompt: list[int]) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        "logprobs": 0})


def test_each_adapter_answers_as_peft_and_the_base_as_the_base(models, tmp_path):
    _, base, adapters, expected = models
    loras = [arg for name, path in adapters.items() for arg in ("--lora", f"{name}={path}")]
    # one slot for two adapters: concurrent requests of both wait for it in turn, none refused
    with run_server(*loras, "--max-loras", "1", "--max-lora-rank", "16", "--served-model-name", "base",
                    "--num-kv-blocks", "128", tmp_path=tmp_path, model_args=("--model", str(base))) as server:
        cards = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]
        assert [c["id"] for c in cards] == ["base", "alpha", "beta"]
        assert [c.get("parent") for c in cards] == [None, "base", "base"]
        jobs = [(model, i) for i in range(len(PROMPTS)) for model in ("alpha", "base", "beta")]
        with ThreadPoolExecutor(len(jobs)) as pool:
            replies = list(pool.map(lambda job: complete(server.base_url, job[0], PROMPTS[job[1]]), jobs))
        for (model, i), reply in zip(jobs, replies, strict=True):
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert body["model"] == model
            assert body["choices"][0]["logprobs"]["tokens"] == expected[model][i], (model, i)
        for name in adapters:
            assert sum(expected[name][i] != expected["base"][i] for i in range(len(PROMPTS))) >= 2
        unknown = complete(server.base_url, "gamma", PROMPTS[0])
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_an_adapter_that_cannot_be_served_refuses_the_start_naming_it(models):
    root, base, adapters, _ = models
    for args, words in [
        (("--lora", f"big={adapters['beta']}", "--max-lora-rank", "8"), ("--lora's adapter 'big'", "rank 16")),
        (("--lora", f"gone={root / 'missing'}"), ("--lora's adapter 'gone'", "adapter_config.json")),
    ]:
        done = subprocess.run([sys.executable, "-m", "flotilla_server.cli", "--model", str(base), "--engine-mode",
                               "inprocess", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert all(w in lines[-1] for w in words) and lines[-1].startswith("flotilla-server: error:"), lines
