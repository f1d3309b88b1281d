"""The gateway in front of two real `flotilla-server`s of one model with LoRA adapters: one serves `alpha`, the
other `alpha` and `beta`. The gateway learns the adapters from their load reports: a request for an adapter
reaches a server that serves it and answers as that server does directly; /v1/models lists the model and
each adapter once, with its parent; an unknown name keeps its 404; the access log names the adapter."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.gateway.test_real_pool import publish_pods
from tests.server.http.server_process import ServerProcess, run_server
from tests.support.gateway_cluster import GatewayProcess, gateway_process, inference_model, serve_api
from tests.support.hf_models import make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter

PROMPT = random_prompts([11], seed=7)[0]


@dataclass
class Fleet:
    one: ServerProcess  # serves alpha
    two: ServerProcess  # serves alpha and beta
    gateway: GatewayProcess


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory: Path = tmp_path_factory.mktemp("real-adapters")
    base = make_hf_model_dir("llama", directory / "base")
    alpha = make_lora_adapter(base, directory / "alpha", rank=4, seed=1)
    beta = make_lora_adapter(base, directory / "beta", rank=4, seed=2)
    common = ("--served-model-name", "base", "--engine-mode", "inprocess", "--max-num-seqs", "4",
              "--num-kv-blocks", "64", "--max-lora-rank", "8")
    with contextlib.ExitStack() as stack:
        one = stack.enter_context(run_server(*common, "--lora", f"alpha={alpha}", tmp_path=directory,
                                             model_args=("--model", str(base))))
        two = stack.enter_context(run_server(*common, "--lora", f"alpha={alpha}", "--lora", f"beta={beta}",
                                             tmp_path=directory, model_args=("--model", str(base))))
        k8s = stack.enter_context(serve_api(directory))
        k8s.create(inference_model("base", replicas=2))
        publish_pods(k8s, "base", [s.base_url.removeprefix("http://") for s in (one, two)])
        gateway = stack.enter_context(gateway_process(k8s.kubeconfig, directory, "--poll-interval-s", "0.1"))
        deadline = time.monotonic() + 10
        while {m["id"] for m in httpx.get(gateway.url + "/v1/models").json()["data"]} != {"base", "alpha", "beta"}:
            assert time.monotonic() < deadline, httpx.get(gateway.url + "/v1/models").text
            time.sleep(0.1)
        yield Fleet(one, two, gateway)


def complete(url: str, model: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=60, json={
        "model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 0})


def adapter_requests(server: ServerProcess, adapter: str) -> float:
    return server.metric("flotilla_lora_requests_total", adapter=adapter)


def test_adapter_requests_reach_servers_that_serve_them_and_answer_as_they_do(fleet: Fleet) -> None:
    direct = {m: complete(fleet.two.base_url, m).json()["choices"][0]["logprobs"]["tokens"]
              for m in ("base", "alpha", "beta")}
    assert direct["beta"] != direct["base"]
    servers = {"one": fleet.one, "two": fleet.two}
    before = {(s, a): adapter_requests(servers[s], a) for s in servers for a in ("alpha", "beta")}
    for model in ("beta", "alpha", "beta", "base", "beta", "alpha"):
        reply = complete(fleet.gateway.url, model)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == model
        assert reply.json()["choices"][0]["logprobs"]["tokens"] == direct[model], model
    after = {(s, a): adapter_requests(servers[s], a) - count for (s, a), count in before.items()}
    assert after[("two", "beta")] == 3 and after[("one", "beta")] == 0  # only two serves beta
    assert after[("one", "alpha")] + after[("two", "alpha")] == 2
    unknown = complete(fleet.gateway.url, "gamma")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    lines = [json.loads(line) for line in fleet.gateway.log().splitlines() if '"logger": "flotilla_gateway.access"'
             in line]
    assert any(e["model"] == "beta" and e["base"] == "base" and e["status"] == 200 for e in lines)


def test_models_lists_the_model_and_each_adapter_once(fleet: Fleet) -> None:
    cards = httpx.get(fleet.gateway.url + "/v1/models").json()["data"]
    assert [(c["id"], c.get("parent")) for c in cards] == [("base", None), ("alpha", "base"), ("beta", "base")]
    report = httpx.get(fleet.two.base_url + "/flotilla/v1/load").json()
    assert [a["name"] for a in report["adapters"]] == ["alpha", "beta"] and report["max_loras"] == 2
