"""The runtime adapter API and the list file over a real server process (its own engine process), with an API
key: POST /v1/load_lora_adapter serves an adapter from under --lora-dir that answers as peft; an unload lets a
request in flight finish and later ones get a 404; every bad load is a 4xx naming its field and its cause,
and leaves the server as it was; the list file's added line is served and its removed line unloaded; the
adapter metrics are exported and move.

The tests share one server (started per worker) and each loads its own adapter names, so they pass in any
order and split across workers."""

from __future__ import annotations

import json
import shutil
import threading
import time

import httpx
import pytest
import torch
from flotilla_server.model.tokenizer import Tokenizer
from safetensors.torch import load_file, save_file

from tests.server.http.server_process import run_server
from tests.server.lora.test_engine_equality import peft_greedy
from tests.support.hf_models import hf_greedy, make_hf_model_dir, random_prompts
from tests.support.lora_adapters import edit_adapter_config, make_lora_adapter

KEY = "sk-test-adapters"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_TOKENS = 6
PROMPTS = random_prompts([9, 21], seed=13)
LONG_TOKENS = 300  # a request still running when its adapter is unloaded (~1 s on the test model)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-runtime-http")
    base = make_hf_model_dir("llama", root / "base")
    allowed, outside = root / "allowed", root / "outside"
    alpha = make_lora_adapter(base, allowed / "alpha", rank=8, seed=1)
    beta = make_lora_adapter(base, outside / "beta", rank=16, seed=2)  # the list file may name any directory
    tokenizer = Tokenizer.from_dir(base)

    def texts(answers: list[list[int]]) -> list[list[str]]:  # each token's text, as `logprobs.tokens` gives it
        return [[tokenizer.decode([t]) for t in tokens] for tokens in answers]

    expected = {"base": texts(hf_greedy(base, PROMPTS, MAX_TOKENS)),
                "alpha": texts(peft_greedy(base, alpha, PROMPTS, MAX_TOKENS)),
                "beta": texts(peft_greedy(base, beta, PROMPTS, MAX_TOKENS))}
    list_file = root / "loras.txt"
    list_file.write_text("# adapters served from the list\n")
    with run_server("--served-model-name", "base", "--lora-dir", str(allowed), "--lora-list-file", str(list_file),
                    "--max-loras", "2", "--max-lora-rank", "16", "--num-kv-blocks", "128", "--log-level", "info",
                    tmp_path=root, model_args=("--model", str(base)), env={"FLOTILLA_API_KEY": KEY}) as server:
        yield {"server": server, "root": root, "base": base, "allowed": allowed, "outside": outside,
               "alpha": alpha, "beta": beta, "expected": expected, "list_file": list_file}


def post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=AUTH if headers is None else headers, timeout=60)


def load(server, name: str, path) -> httpx.Response:
    return post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})


def unload(server, name: str) -> httpx.Response:
    return post(server, "/v1/unload_lora_adapter", {"lora_name": name})


def complete(server, model: str, prompt, max_tokens: int = MAX_TOKENS) -> httpx.Response:
    return post(server, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                            "temperature": 0, "ignore_eos": True, "logprobs": 0})


def served(server) -> dict[str, str | None]:
    cards = httpx.get(f"{server.base_url}/v1/models", headers=AUTH, timeout=10).json()["data"]
    return {c["id"]: c.get("parent") for c in cards}


def answers_as(server, model: str, expected: list[list[str]]) -> None:
    for prompt, want in zip(PROMPTS, expected, strict=True):
        reply = complete(server, model, prompt)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == model and reply.json()["choices"][0]["logprobs"]["tokens"] == want


def test_the_api_needs_the_key(setup):
    server = setup["server"]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            reply = post(server, path, {"lora_name": "x", "lora_path": str(setup["alpha"])}, headers=headers)
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"


def test_a_loaded_adapter_is_listed_and_answers_as_peft(setup):
    server = setup["server"]
    reply = load(server, "alpha", setup["alpha"])
    assert reply.status_code == 200 and reply.text in ("Success: LoRA adapter 'alpha' added successfully.",
                                                       f"Success: LoRA adapter 'alpha' is already loaded from "
                                                       f"{setup['alpha']}.")
    assert served(server)["alpha"] == "base"
    answers_as(server, "alpha", setup["expected"]["alpha"])
    answers_as(server, "base", setup["expected"]["base"])
    again = load(server, "alpha", setup["allowed"] / "alpha" / ".." / "alpha")  # the same directory: idempotent
    assert again.status_code == 200 and "already loaded" in again.text
    (setup["allowed"] / "alpha2").mkdir(exist_ok=True)
    other = load(server, "alpha", setup["allowed"] / "alpha2")
    assert other.status_code == 409 and other.json()["error"]["param"] == "lora_name"


def spoiled(setup, name: str, spoil) -> str:
    path = setup["allowed"] / name
    if not path.exists():
        shutil.copytree(setup["alpha"], path)
        spoil(path)
    return str(path)


def add_module(path) -> None:
    weights = load_file(path / "adapter_model.safetensors")
    weights["base_model.model.model.layers.0.self_attn.rotary.lora_A.weight"] = torch.zeros(8, 64)
    save_file(weights, path / "adapter_model.safetensors")


def another_base(setup) -> str:
    path = setup["allowed"] / "wide"
    if not path.exists():
        wide = make_hf_model_dir("llama", setup["root"] / "wide-base", hidden_size=128)
        make_lora_adapter(wide, path, rank=4, seed=5)
    return str(path)


def empty(setup) -> str:
    (setup["allowed"] / "empty").mkdir(exist_ok=True)
    return str(setup["allowed"] / "empty")


def linked_out(setup) -> str:
    link = setup["allowed"] / "link"
    if not link.exists():
        link.symlink_to(setup["beta"])
    return str(link)


@pytest.mark.parametrize(("body", "status", "param", "words"), [
    (lambda s: {"lora_name": "r32", "lora_path": str(make_lora_adapter(s["base"], s["allowed"] / "r32", rank=32))},
     400, "lora_path", "rank 32 at layer 0"),
    (lambda s: {"lora_name": "mod", "lora_path": spoiled(s, "mod", add_module)}, 400, "lora_path",
     "targets a module that is not served"),
    (lambda s: {"lora_name": "wide", "lora_path": another_base(s)}, 400, "lora_path", "trained for another base"),
    (lambda s: {"lora_name": "empty", "lora_path": empty(s)}, 400, "lora_path", "adapter_config.json not found"),
    (lambda s: {"lora_name": "dora", "lora_path": spoiled(s, "dora", lambda p: edit_adapter_config(p, use_dora=True))},
     400, "lora_path", "use_dora is true"),
    (lambda s: {"lora_name": "mts", "lora_path": spoiled(
        s, "mts", lambda p: edit_adapter_config(p, modules_to_save=["lm_head"]))}, 400, "lora_path", "modules_to_save"),
    (lambda s: {"lora_name": "head", "lora_path": spoiled(
        s, "head", lambda p: edit_adapter_config(p, target_modules=["q_proj", "lm_head"]))}, 400, "lora_path",
     "adapts the head or the embedding"),
    (lambda s: {"lora_name": "out", "lora_path": str(s["beta"])}, 400, "lora_path", "not under a directory"),
    (lambda s: {"lora_name": "link", "lora_path": linked_out(s)}, 400, "lora_path", "(really "),
    (lambda s: {"lora_name": "rel", "lora_path": "alpha"}, 400, "lora_path", "is relative"),
    (lambda s: {"lora_name": "base", "lora_path": str(s["alpha"])}, 400, "lora_name", "the served model's name"),
    (lambda s: {"lora_name": "a b", "lora_path": str(s["alpha"])}, 400, "lora_name", "must start with a letter"),
    (lambda s: {"lora_name": "x", "lora_path": str(s["alpha"]), "lora_modules": []}, 400, "lora_modules",
     "Extra inputs are not permitted"),
    (lambda s: {"lora_name": "x"}, 400, "lora_path", "Field required"),
    (lambda s: {"lora_name": "x", "lora_path": str(s["alpha"]), "load_inplace": True}, 400, "load_inplace",
     "unload the adapter"),
])
def test_each_bad_load_is_a_4xx_naming_its_field_and_cause(setup, body, status, param, words):
    server = setup["server"]
    sent = body(setup)
    reply = post(server, "/v1/load_lora_adapter", sent)
    error = reply.json()["error"]
    assert (reply.status_code, error["param"]) == (status, param), reply.text
    assert words in error["message"]
    if "lora_name" in sent:
        assert sent["lora_name"] not in served(server) or sent["lora_name"] == "base"


def test_an_unknown_adapter_s_unload_is_a_404(setup):
    reply = unload(setup["server"], "never-loaded")
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "lora_name"


def stream_text(server, model: str, out: dict, unloaded: threading.Event) -> None:
    body = {"model": model, "prompt": PROMPTS[0], "max_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line.removeprefix("data: "))["choices"][0]
            out["text"] = out.get("text", "") + choice["text"]
            out["chunks"] = out.get("chunks", 0) + 1
            out["after_unload"] = out.get("after_unload", 0) + unloaded.is_set()
            out["finish"] = choice["finish_reason"] or out.get("finish")
            out.setdefault("started", threading.Event()).set()


def test_an_unload_lets_the_request_in_flight_finish_and_the_next_gets_a_404(setup):
    server = setup["server"]
    assert load(server, "gamma", setup["alpha"]).status_code == 200  # alpha's directory under another name
    reference = post(server, "/v1/completions", {"model": "gamma", "prompt": PROMPTS[0], "max_tokens": LONG_TOKENS,
                                                 "temperature": 0, "ignore_eos": True}).json()["choices"][0]["text"]
    out: dict = {"started": threading.Event()}
    unloaded = threading.Event()
    thread = threading.Thread(target=stream_text, args=(server, "gamma", out, unloaded))
    thread.start()
    assert out["started"].wait(30)
    reply = unload(server, "gamma")
    unloaded.set()
    assert reply.status_code == 200 and reply.text == "Success: LoRA adapter 'gamma' removed successfully."
    later = complete(server, "gamma", PROMPTS[1])
    assert later.status_code == 404 and later.json()["error"]["code"] == "model_not_found"
    assert "gamma" not in served(server)
    thread.join(60)
    assert out["after_unload"] > 0, "the request ended before the unload: nothing was in flight"
    assert out["finish"] == "length" and out["text"] == reference  # with the adapter to its last token


def wait_for(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not picked up in time"
        time.sleep(0.1)


def test_the_list_file_s_added_line_is_served_and_its_removed_line_unloaded(setup):
    server, file = setup["server"], setup["list_file"]
    file.write_text(f"# adapters served from the list\nbeta = {setup['beta']}\nnot a line\n")
    wait_for(lambda: "beta" in served(server))
    answers_as(server, "beta", setup["expected"]["beta"])
    refused = unload(server, "beta")
    assert refused.status_code == 409 and "remove its line" in refused.json()["error"]["message"]
    file.write_text("# adapters served from the list\n")
    wait_for(lambda: "beta" not in served(server))
    assert complete(server, "beta", PROMPTS[0]).status_code == 404
    assert "line 3" in server.log() and "the line is skipped" in server.log()


def test_the_adapter_metrics_are_exported_and_move(setup):
    server = setup["server"]
    assert load(server, "delta", setup["alpha"]).status_code == 200
    before = server.metrics()
    assert complete(server, "delta", PROMPTS[0]).status_code == 200
    after = server.metrics()
    assert after[("flotilla_lora_requests_total", (("adapter", "delta"),))] == \
        before.get(("flotilla_lora_requests_total", (("adapter", "delta"),)), 0) + 1
    assert after[("flotilla_lora_adapter_loads_total", ())] >= 1
    assert after[("flotilla_lora_adapter_load_seconds_count", ())] == after[("flotilla_lora_adapter_loads_total", ())]
    assert after[("flotilla_lora_adapter_load_seconds_sum", ())] > 0
    assert 1 <= after[("flotilla_lora_adapters_resident", ())] <= 2
    assert ("flotilla_lora_adapter_evictions_total", ()) in after
    info = [(labels, value) for (name, labels), value in after.items() if name == "vllm:lora_requests_info"]
    assert len(info) == 1
    labels, value = dict(info[0][0]), info[0][1]
    assert labels["max_lora"] == "2" and set(labels) == {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}
    assert time.time() - 3600 < value <= time.time()
