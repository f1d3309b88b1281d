"""EngineClient: streams from the engine thread, deferrals, client aborts and the slow-client abort."""

from __future__ import annotations

import asyncio

import pytest
from flotilla_server.engine.client import EngineClient
from flotilla_server.engine.sampling_params import SamplingParams

from tests.support.hf_models import random_prompts

from .conftest import make_engine, run_to_completion

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture
def llama(hf_model):
    return hf_model("llama")[1]


@pytest.fixture
def engine_factory(llama):
    engines: list[EngineClient] = []

    def make(stream_buffer_events: int = 256, **config) -> EngineClient:
        engine = EngineClient(make_engine(llama, **config), stream_buffer_events=stream_buffer_events)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for e in engines:
        e.shutdown()


async def until(predicate, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_stream_yields_the_same_tokens_as_the_sync_engine(llama, engine_factory) -> None:
    prompt = random_prompts([25], seed=11)[0]
    expected = run_to_completion(make_engine(llama), {"a": (prompt, GREEDY)})["a"]
    engine = engine_factory()
    stream = engine.try_add_request("a", prompt, GREEDY, asyncio.get_running_loop())
    assert stream is not None
    events = [e async for e in stream]
    assert [t for e in events for t in e.token_ids] == expected["token_ids"]
    assert "".join(e.text for e in events) == expected["text"]
    assert [e.finish_reason for e in events] == [None] * (len(events) - 1) + ["length"]
    assert events[-1].num_output_tokens == 20 and events[-1].num_prompt_tokens == 25
    await until(lambda: engine.stats().kv_blocks_used == 0)


async def test_no_slot_is_a_counted_deferral(engine_factory) -> None:
    engine = engine_factory(max_num_seqs=1)
    loop = asyncio.get_running_loop()
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    first = engine.try_add_request("a", [1, 2, 3], long, loop)
    assert first is not None
    assert engine.try_add_request("b", [1, 2, 3], GREEDY, loop) is None
    assert engine.stats().deferrals["no_slot"] == 1
    with pytest.raises(ValueError, match="already in use"):
        engine.try_add_request("a", [1, 2, 3], GREEDY, loop)
    with pytest.raises(ValueError, match="shorten the prompt"):
        engine.try_add_request("c", [1] * 1020, GREEDY, loop)
    engine.abort("a", "client_gone")
    events = [e async for e in first]
    assert events[-1].finish_reason == "abort" and events[-1].abort_reason == "client_gone"
    await until(lambda: engine.stats().kv_blocks_used == 0)
    assert engine.try_add_request("b", [1, 2, 3], GREEDY, loop) is not None


async def test_client_abort_frees_blocks_within_a_step(engine_factory) -> None:
    engine = engine_factory()
    loop = asyncio.get_running_loop()
    long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    stream = engine.try_add_request("a", random_prompts([100], seed=12)[0], long, loop)
    first = await stream.__anext__()
    assert first.token_ids and engine.stats().kv_blocks_used > 0
    engine.abort("a", "client_gone")
    assert engine.stats().kv_blocks_used == 0  # freed by the abort itself, not at the end of the stream
    rest = [e async for e in stream]
    assert rest[-1].abort_reason == "client_gone"


async def test_slow_client_is_aborted_and_never_holds_the_batch(engine_factory) -> None:
    engine = engine_factory(stream_buffer_events=3)
    loop = asyncio.get_running_loop()
    long = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    slow = engine.try_add_request("slow", [5, 6, 7], long, loop)
    fast = engine.try_add_request("fast", [8, 9], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True), loop)
    fast_events = [e async for e in fast]  # never reads `slow` meanwhile
    assert fast_events[-1].finish_reason == "length"
    await until(lambda: slow.finished)
    events = [e async for e in slow]
    assert len(events) <= 4  # the bounded buffer plus the final event
    assert events[-1].finish_reason == "abort" and events[-1].abort_reason == "slow_client"
    await until(lambda: engine.stats().kv_blocks_used == 0)
    assert engine.stats().num_running == 0
