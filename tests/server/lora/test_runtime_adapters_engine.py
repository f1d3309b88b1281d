"""Runtime adapter loads and unloads in the engine (engine/adapter_service.py, loop.py), driven turn by turn:
a loaded adapter answers as peft; two concurrent loads of one name read it once; an unload lets the requests
already in the engine finish with the adapter, refuses later ones, and frees its slot once they are done; an
adapter loaded again under the same name never reuses the old one's KV blocks; the list file's lines are
loaded and unloaded as it changes, and a bad line is skipped."""

from __future__ import annotations

import threading

import pytest
from flotilla_server.engine.adapter_cache import AdapterCache
from flotilla_server.engine.adapter_service import AdapterService
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.loop import EngineLoop
from flotilla_server.engine.lora_list import LIST_POLL_S, LoraListFile
from flotilla_server.engine.messages import AddRequest, EngineOptions, LoadAdapter, UnloadAdapter
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import load_model
from flotilla_server.model.lora_adapter import load_adapter

from tests.server.lora.test_engine_equality import peft_greedy
from tests.support.hf_models import hf_greedy, make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter

MAX_TOKENS = 6
PROMPT = random_prompts([37], seed=5)[0]  # two full blocks of 16: a prefix-cache hit is visible


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-runtime")
    base = make_hf_model_dir("llama", root / "base")
    adapters = {"a": make_lora_adapter(base, root / "a", rank=8, seed=1),
                "b": make_lora_adapter(base, root / "b", rank=4, seed=2)}
    expected = {None: hf_greedy(base, [PROMPT], MAX_TOKENS)[0]}
    expected |= {name: peft_greedy(base, path, [PROMPT], MAX_TOKENS)[0] for name, path in adapters.items()}
    return load_model(str(base), "float32", "cpu"), adapters, expected


def new_loop(models, **config) -> EngineLoop:
    config = {"model": "unused", "num_kv_blocks": 64, "max_lora_rank": 16, "lora_runtime_loads": True} | config
    return EngineLoop(EngineCore(EngineConfig(**config), loaded=models[0]), EngineOptions())


def turns(loop: EngineLoop, n: int = 1) -> list:
    return [u for _ in range(n) if (u := loop.turn(lambda _: False)) is not None]


def answer(loop: EngineLoop, call_id: str, limit: int = 5000):
    for _ in range(limit):
        for update in turns(loop):
            for reply in update.adapter_replies:
                if reply.call_id == call_id:
                    return reply
        threading.Event().wait(0.001)
    raise AssertionError(f"no answer to {call_id}")


def generate(loop: EngineLoop, rid: str, adapter: str | None, max_tokens: int = MAX_TOKENS) -> None:
    loop.apply(AddRequest(rid, PROMPT, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                                      lora=adapter)))


def run_to_end(loop: EngineLoop, tokens: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    tokens = {} if tokens is None else tokens
    for _ in range(500):
        for update in turns(loop):
            for out in update.outputs:
                tokens.setdefault(out.request_id, []).extend(out.token_ids)
            for rid, why in update.refused:
                tokens[rid] = why  # type: ignore[assignment]
        if not loop.has_work():
            return tokens
    raise AssertionError("the engine did not finish")


def test_a_loaded_adapter_answers_as_peft_and_an_unload_lets_its_requests_finish(models):
    _, adapters, expected = models
    loop = new_loop(models, max_loras=1)
    loop.apply(LoadAdapter("c1", "a", str(adapters["a"])))
    reply = answer(loop, "c1")
    assert (reply.status, reply.message) == (200, "Success: LoRA adapter 'a' added successfully.")
    assert loop.core.stats().adapters_served == ("a",)
    generate(loop, "first", "a", max_tokens=3 * MAX_TOKENS)
    partial: dict[str, list[int]] = {}
    for update in turns(loop, 3):  # admitted and a few tokens in: the request uses the adapter's slot
        for out in update.outputs:
            partial.setdefault(out.request_id, []).extend(out.token_ids)
    assert 0 < len(partial["first"]) < 3 * MAX_TOKENS
    loop.apply(UnloadAdapter("c2", "a"))
    generate(loop, "later", "a")
    tokens = run_to_end(loop, partial)
    assert "not served here" in tokens["later"]  # refused: the HTTP side answers it 404 before it gets here
    assert tokens["first"][:MAX_TOKENS] == expected["a"] and len(tokens["first"]) == 3 * MAX_TOKENS
    cache = loop.core.adapters
    assert cache.adapters == {} and cache.resident == [None] and loop.core.stats().adapters_served == ()
    loop.apply(UnloadAdapter("c3", "a"))
    assert answer(loop, "c3").status == 404
    loop.close()


def test_an_adapter_loaded_again_under_its_name_never_reuses_the_old_one_s_blocks(models):
    _, adapters, expected = models
    loop = new_loop(models, max_loras=2)
    loop.apply(LoadAdapter("c1", "x", str(adapters["a"])))
    assert answer(loop, "c1").status == 200
    generate(loop, "x-1", "x")
    assert run_to_end(loop)["x-1"] == expected["a"]
    loop.apply(UnloadAdapter("c2", "x"))
    loop.apply(LoadAdapter("c3", "x", str(adapters["b"])))
    assert answer(loop, "c3").status == 200
    hits = loop.core.stats().prefix_cache_hits
    generate(loop, "x-2", "x")
    assert run_to_end(loop)["x-2"] == expected["b"]
    assert loop.core.stats().prefix_cache_hits == hits  # the same prompt, another adapter under the name
    generate(loop, "x-3", "x")
    assert run_to_end(loop)["x-3"] == expected["b"]
    assert loop.core.stats().prefix_cache_hits > hits  # its own blocks are shared as usual
    loop.close()


def service_over(models, tmp_path, **kwargs) -> tuple[AdapterService, list[str]]:
    loaded, _, _ = models
    cache = AdapterCache.build(loaded.model, loaded.config, (), 2, 16, loaded.model.compute_dtype, "cpu", runtime=True)
    reads: list[str] = []

    def reader(name, source, base, max_rank):
        reads.append(name)
        return load_adapter(name, source, base, max_rank)

    kwargs.setdefault("runtime_loads", True)
    return AdapterService(cache, loaded.config, 16, reserved=("base",), reader=reader, **kwargs), reads


def settle(service: AdapterService) -> list:
    replies = []
    for _ in range(5000):
        replies += service.turn()
        if not service.busy:
            return replies + service.turn()
        threading.Event().wait(0.001)
    raise AssertionError("reads never ended")


def test_two_concurrent_loads_of_one_name_read_it_once_and_conflicts_are_refused(models, tmp_path):
    _, adapters, _ = models
    service, reads = service_over(models, tmp_path)
    service.load(LoadAdapter("1", "a", str(adapters["a"])))
    service.load(LoadAdapter("2", "a", str(adapters["a"])))
    service.load(LoadAdapter("3", "a", str(adapters["b"])))  # another directory under a name being read
    service.unload(UnloadAdapter("4", "a"))  # still loading
    service.load(LoadAdapter("5", "base", str(adapters["b"])))
    service.load(LoadAdapter("6", "bad", str(tmp_path / "missing")))
    replies = {r.call_id: r for r in settle(service)}
    assert reads == ["a", "bad"]
    assert {c: replies[c].status for c in "123456"} == {"1": 200, "2": 200, "3": 409, "4": 409, "5": 400, "6": 400}
    assert "adapter_config.json not found" in replies["6"].message and replies["6"].param == "lora_path"
    service.load(LoadAdapter("7", "a", str(adapters["a"])))  # served from there already: idempotent
    assert [(r.status, "already loaded" in r.message) for r in settle(service)] == [(200, True)]
    assert reads == ["a", "bad"]


def test_loads_are_refused_when_runtime_loads_are_off(models, tmp_path):
    service, reads = service_over(models, tmp_path, runtime_loads=False)
    service.load(LoadAdapter("1", "a", str(tmp_path)))
    assert [(r.status, r.param) for r in settle(service)] == [(403, "lora_path")] and reads == []


def test_the_list_file_is_followed_and_a_bad_line_skipped(models, tmp_path, caplog):
    _, adapters, _ = models
    file = tmp_path / "loras"
    file.write_text(f"a={adapters['a']}\n")
    now = [0.0]
    listed = LoraListFile(str(file))
    entries = listed.read_if_changed().entries
    service, _ = service_over(models, tmp_path, list_file=listed, listed=entries, clock=lambda: now[0])
    service.cache.add(load_adapter("a", str(adapters["a"]), models[0].config))  # as the core reads it at start
    service.unload(UnloadAdapter("1", "a"))
    assert [(r.status, "remove its line" in r.message) for r in settle(service)] == [(409, True)]
    file.write_text(f"# now b\nb = {adapters['b']}\nnot a line\n")
    now[0] += LIST_POLL_S
    settle(service)
    assert list(service.cache.served) == ["b"] and service.owned == {"b": str(adapters["b"])}
    assert "line 3" in caplog.text and "the line is skipped" in caplog.text
    file.write_text(f"b={adapters['b']}\nc={tmp_path / 'not-yet'}\n")
    now[0] += LIST_POLL_S
    settle(service)
    assert list(service.cache.served) == ["b"] and "'c'" in caplog.text  # c failed: logged, tried again later
    make_lora_adapter(adapters["a"].parent / "base", tmp_path / "not-yet", rank=4, seed=3)
    now[0] += 10.0
    settle(service)
    assert sorted(service.cache.served) == ["b", "c"]
