"""EngineClient in both modes: streams, the engine-side admission queue, aborts, slow clients, and an abort
that arrives between a step's plan and its execution (once fatal to every request in the batch)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.factory import make_engine
from flotilla_server.engine.messages import EngineOptions
from flotilla_server.engine.sampling_params import SamplingParams

from tests.support.engine_hooks import pause_at_step
from tests.support.hf_models import hf_greedy, random_prompts

from .conftest import DEVICE, run_to_completion
from .conftest import make_engine as make_core

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture
def llama(hf_model):
    return hf_model("llama")


@pytest.fixture
def engine_factory(llama):
    path, loaded = llama
    engines = []

    def make(mode: str = "inprocess", stream_buffer_events: int = 256, options: EngineOptions | None = None,
             **config):
        cfg = EngineConfig(model=str(path), device=DEVICE, **config)
        engine = make_engine(cfg, mode, options, loaded=loaded if mode == "inprocess" else None,  # type: ignore[arg-type]
                             stream_buffer_events=stream_buffer_events)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for e in engines:
        e.shutdown()


async def until(predicate, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def collect(stream) -> list:
    return [e async for e in stream]


def tokens(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


@pytest.mark.parametrize("mode", ["inprocess", "process"])
async def test_stream_yields_the_same_tokens_as_the_sync_engine(llama, engine_factory, mode) -> None:
    prompt = random_prompts([25], seed=11)[0]
    expected = run_to_completion(make_core(llama[1]), {"a": (prompt, GREEDY)})["a"]
    engine = engine_factory(mode)
    stream = engine.submit("a", prompt, GREEDY, asyncio.get_running_loop())
    events = await collect(stream)
    assert stream.admitted.done()
    assert tokens(events) == expected["token_ids"]
    assert "".join(e.text for e in events) == expected["text"]
    assert [e.finish_reason for e in events] == [None] * (len(events) - 1) + ["length"]
    assert events[-1].num_output_tokens == 20 and events[-1].num_prompt_tokens == 25
    await until(lambda: engine.stats().kv_blocks_used == 0)


@pytest.mark.parametrize("mode", ["inprocess", "process"])
async def test_concurrent_streams_equal_transformers_token_for_token(llama, engine_factory, mode) -> None:
    path, _ = llama
    prompts, new_tokens = random_prompts([5, 40, 130, 17], seed=23), [12, 20, 8, 16]
    engine = engine_factory(mode, max_num_seqs=4, max_num_batched_tokens=64, prefill_chunk=32)
    loop = asyncio.get_running_loop()
    streams = [engine.submit(f"r{i}", prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), loop)
               for i, (prompt, n) in enumerate(zip(prompts, new_tokens, strict=True))]
    got = [tokens(events) for events in await asyncio.gather(*(collect(s) for s in streams))]
    assert got == hf_greedy(path, prompts, new_tokens)


async def test_a_request_waits_in_the_engine_until_a_slot_frees(engine_factory) -> None:
    engine = engine_factory(max_num_seqs=1)
    loop = asyncio.get_running_loop()
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    first = engine.submit("a", [1, 2, 3], long, loop)
    await first.admitted
    second = engine.submit("b", [1, 2, 3], GREEDY, loop)
    await until(lambda: engine.stats().deferrals.get("no_slot", 0) >= 1)
    assert not second.admitted.done()
    with pytest.raises(ValueError, match="already in use"):
        engine.submit("a", [1, 2, 3], GREEDY, loop)
    with pytest.raises(ValueError, match="shorten the prompt"):
        engine.submit("c", [1] * 1020, GREEDY, loop)
    engine.abort("a", "client_gone")
    events = await collect(first)
    assert events[-1].finish_reason == "abort" and events[-1].abort_reason == "client_gone"
    await asyncio.wait_for(second.admitted, 30)
    assert (await collect(second))[-1].finish_reason == "length"
    await until(lambda: engine.stats().kv_blocks_used == 0)


async def test_aborting_a_waiter_withdraws_it_from_the_engine_queue(engine_factory) -> None:
    engine = engine_factory(max_num_seqs=1)
    loop = asyncio.get_running_loop()
    long = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    first = engine.submit("a", [1, 2, 3], long, loop)
    waiter = engine.submit("w", [4, 5, 6], GREEDY, loop)
    engine.abort("w", "queue_timeout")
    assert (await collect(waiter))[-1].abort_reason == "queue_timeout"
    assert (await collect(first))[-1].finish_reason == "length"
    await until(lambda: engine.stats().num_running == 0 and engine.stats().kv_blocks_used == 0)


async def test_client_abort_frees_blocks_before_the_next_step(engine_factory) -> None:
    engine = engine_factory()
    loop = asyncio.get_running_loop()
    long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    stream = engine.submit("a", random_prompts([100], seed=12)[0], long, loop)
    first = await stream.__anext__()
    assert first.token_ids
    engine.abort("a", "client_gone")
    rest = await collect(stream)  # the stream ends at once, without waiting for the engine
    assert rest[-1].abort_reason == "client_gone"
    await until(lambda: engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0)


async def test_slow_client_is_aborted_and_never_holds_the_batch(engine_factory) -> None:
    # `fast` asks for fewer tokens than the buffer holds, so it cannot overflow even when the event loop runs
    # a batch of deliveries before its reader's turn (CI met `fast` aborted with a 3-event buffer)
    buffer_events = 16
    engine = engine_factory(stream_buffer_events=buffer_events)
    loop = asyncio.get_running_loop()
    long = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    slow = engine.submit("slow", [5, 6, 7], long, loop)
    short = SamplingParams(max_tokens=buffer_events - 2, temperature=0.0, ignore_eos=True)
    fast = engine.submit("fast", [8, 9], short, loop)
    fast_events = await collect(fast)  # never reads `slow` meanwhile
    assert fast_events[-1].finish_reason == "length"
    await until(lambda: slow.finished)
    events = await collect(slow)
    assert len(events) <= buffer_events + 1  # the bounded buffer plus the final event
    assert events[-1].finish_reason == "abort" and events[-1].abort_reason == "slow_client"
    await until(lambda: engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0)


@pytest.mark.parametrize("mode", ["inprocess", "process"])
async def test_an_abort_between_plan_and_execute_leaves_the_others_exact(llama, engine_factory, mode,
                                                                       tmp_path: Path) -> None:
    """The engine pauses after planning step 3 until the abort of `b` is in its inbox: `b`'s block table is
    in that plan. The abort waits for the step to end; `a` and `c` finish with their solo tokens."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = dict(zip("abc", random_prompts([9, 30, 17], seed=5), strict=True))
    solo = {rid: run_to_completion(make_core(llama[1]), {rid: (p, params)})[rid]["token_ids"]
            for rid, p in prompts.items()}
    marker = tmp_path / "paused"
    hook = functools.partial(pause_at_step, 3, str(marker))
    engine = engine_factory(mode, options=EngineOptions(step_hook=hook))
    loop = asyncio.get_running_loop()
    streams = {rid: engine.submit(rid, p, params, loop) for rid, p in prompts.items()}
    await until(marker.exists)
    engine.abort("b", "client_gone")
    results = {rid: await collect(s) for rid, s in streams.items()}
    assert results["b"][-1].abort_reason == "client_gone"
    for rid in "ac":
        assert results[rid][-1].finish_reason == "length", results[rid][-1]
        assert tokens(results[rid]) == solo[rid]
    assert engine.alive
    await until(lambda: engine.stats().kv_blocks_used == 0 and engine.stats().num_running == 0)


async def test_two_engine_processes_in_one_server_and_one_shut_down_frees_its_process(llama, engine_factory) -> None:
    first = engine_factory("process")
    second = engine_factory("process", options=EngineOptions(load_nice=5, load_threads=1, num_threads=1))
    assert first.pid != second.pid and first.pid != 0
    second.shutdown()
    assert not Path(f"/proc/{second.pid}").exists() or "Z" in Path(f"/proc/{second.pid}/stat").read_text().split()[2]
    assert not second.alive and first.alive
    events = await collect(first.submit("a", [1, 2, 3], GREEDY, asyncio.get_running_loop()))
    assert events[-1].finish_reason == "length"
