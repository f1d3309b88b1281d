"""The model cache over real engines (on threads) (a small random Llama directory, quicker to load than tiny):
loads on demand, evicts by the policy, never a busy model, refuses a model that can never fit, follows the
model list file; each rule from the request side."""

from __future__ import annotations

import asyncio

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model_cache.cache import ModelCache
from flotilla_server.model_cache.engine_processes import EngineProcesses
from flotilla_server.model_cache.specs import ModelSpec
from flotilla_server.model_cache.status import CacheHooks, Infeasible, LoadTimeout, UnknownModel

from tests.support.hf_models import make_hf_model_dir

ENGINES = EngineProcesses(EngineConfig(kv_cache_memory_bytes=2**20, max_num_seqs=2, max_num_batched_tokens=64,
                                       prefill_chunk=64), "inprocess")  # engine threads: quicker than processes
SOURCE, MODEL_BYTES, THREE = "", 0, ()  # set by the module fixture


@pytest.fixture(scope="module", autouse=True)
def weights_helper(tmp_path_factory):
    """One model directory for the module."""
    global SOURCE, MODEL_BYTES, THREE
    SOURCE = str(make_hf_model_dir("llama", tmp_path_factory.mktemp("cache") / "m"))
    MODEL_BYTES = ENGINES.footprint_bytes(SOURCE)
    THREE = tuple(ModelSpec(n, SOURCE) for n in ("a", "b", "c"))
    ENGINES.start()
    yield
    ENGINES.close()


@pytest.fixture
def cache_of():
    made = []

    def make(budget_models: float, min_residency_s: float = 0.0, specs=None, list_file=None):
        evicted: list[str] = []
        loads: list[float] = []
        cache = ModelCache(ENGINES, THREE if specs is None else specs, int(budget_models * MODEL_BYTES),
                           min_residency_s, list_file,
                           CacheHooks(evicting=evicted.append, load_seconds=loads.append))
        cache.evicted_names, cache.load_times = evicted, loads
        cache.start()
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.shutdown(close_engines=False)


async def use(cache: ModelCache, name: str, timeout_s: float = 60.0) -> None:
    handle = await cache.acquire(name, timeout_s)
    assert handle.name == name and handle.engine.stats().kv_blocks_total > 0
    cache.release(name)


def states(cache: ModelCache) -> dict[str, str]:
    return {s.name: s.state for s in cache.status()}


def test_the_least_recently_used_idle_model_is_evicted(cache_of):
    cache = cache_of(budget_models=2.5)

    async def scenario():
        for name in ("a", "b", "a", "c"):  # b is least recently used when c needs room
            await use(cache, name)

    asyncio.run(scenario())
    assert cache.evicted_names == ["b"]
    assert states(cache) == {"a": "loaded", "b": "available", "c": "loaded"}
    assert len(cache.load_times) == 3 and cache.used_bytes() == 2 * MODEL_BYTES


def test_a_busy_model_is_never_evicted(cache_of):
    cache = cache_of(budget_models=2.5)

    async def scenario():
        held = await cache.acquire("a", 60)  # a request holds a: it is older, but busy
        await use(cache, "b")
        await use(cache, "c")
        assert held.engine.stats().kv_blocks_total > 0
        cache.release("a")

    asyncio.run(scenario())
    assert cache.evicted_names == ["b"]


def test_a_young_model_is_kept_for_its_minimum_residency(cache_of):
    cache = cache_of(budget_models=1.5, min_residency_s=600)

    async def scenario():
        await use(cache, "a")
        with pytest.raises(LoadTimeout):
            await cache.acquire("b", 1.0)

    asyncio.run(scenario())
    assert cache.evicted_names == [] and states(cache)["a"] == "loaded"
    assert cache.status()[1].users == 0  # the timed-out request gave its claim back


def test_a_load_queued_behind_a_resident_model_reports_loading(cache_of):
    """A router reads `loading` as "this pod will hold it": a queued load must say so, or the next request
    for the model starts a second load on another pod."""
    cache = cache_of(budget_models=1.5, min_residency_s=600)

    async def scenario():
        await use(cache, "a")
        waiting = asyncio.create_task(cache.acquire("b", 1.0))
        await asyncio.sleep(0.3)
        queued = states(cache)["b"]
        with pytest.raises(LoadTimeout):
            await waiting
        return queued

    assert asyncio.run(scenario()) == "loading"
    assert states(cache)["b"] == "available"  # nobody waits for it any more


def test_a_model_larger_than_the_budget_is_refused_at_once(cache_of):
    cache = cache_of(budget_models=0.5)

    async def scenario():
        with pytest.raises(Infeasible):
            await asyncio.wait_for(cache.acquire("a", 60), 1.0)  # at once: no load, no wait
        with pytest.raises(UnknownModel):
            await cache.acquire("nope", 60)

    asyncio.run(scenario())
    assert cache.load_times == []


def test_the_list_file_adds_and_removes_models_without_a_restart(cache_of, tmp_path):
    listing = tmp_path / "models"
    listing.write_text(f"a={SOURCE}\n")
    cache = cache_of(budget_models=2.5, specs=(), list_file=str(listing))
    cache.check_list_now()
    assert cache.names() == ["a"]

    async def scenario():
        await use(cache, "a")
        listing.write_text(f"# a left the pool\nb={SOURCE}\n")
        cache.check_list_now()
        with pytest.raises(UnknownModel):
            await cache.acquire("a", 60)
        await use(cache, "b")

    asyncio.run(scenario())
    assert cache.names() == ["b"]
