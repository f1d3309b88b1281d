"""The admission driver against the real engine on tiny, in-process: exact races that HTTP timing cannot pin."""

from __future__ import annotations

import asyncio
import threading

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.factory import EngineClient
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.http.admission import AdmissionQueue, ClientGone, QueueFull, QueueTimeout

LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


class _HookedEngine(EngineClient):
    """The real engine, plus a callback the moment a request is admitted (to stage exact races)."""

    on_admit = None

    def try_add_request(self, request_id, prompt_token_ids, params, loop):
        stream = super().try_add_request(request_id, prompt_token_ids, params, loop)
        if stream is not None and self.on_admit is not None:
            self.on_admit(request_id)
        return stream


@pytest.fixture(scope="module")
def core():
    return EngineCore(EngineConfig(max_num_seqs=2, max_model_len=512))


@pytest.fixture
def engine(core):
    e = _HookedEngine(core)
    e.start()
    yield e
    e.shutdown()
    assert core.stats().num_running == 0


def _never_gone():
    return asyncio.Event().wait()


async def _queue(engine, depth=2, timeout_s=30.0) -> AdmissionQueue:
    q = AdmissionQueue(engine, depth=depth, max_overtakes=2, queue_timeout_s=timeout_s)
    q.start()
    engine.add_step_listener(q.signal_capacity)
    return q


async def _drain(stream) -> int:
    n = 0
    async for event in stream:
        n = event.num_output_tokens
    return n


async def test_fifo_admission_and_completion(engine):
    q = await _queue(engine, depth=4)
    results = await asyncio.gather(*(q.admit(f"fifo-{i}", [5, 6, 7], SHORT, _never_gone) for i in range(5)))
    assert await asyncio.gather(*(_drain(s) for s, _ in results)) == [4] * 5
    await q.stop()


async def test_full_queue_refuses_at_once_and_a_wait_past_the_budget_times_out(engine):
    q = await _queue(engine, depth=1, timeout_s=0.3)
    running = [await q.admit(f"long-{i}", [1, 2, 3], LONG, _never_gone) for i in range(2)]  # both slots
    waiter = asyncio.create_task(q.admit("waits", [1, 2, 3], SHORT, _never_gone))
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFull):
        await q.admit("refused", [1, 2, 3], SHORT, _never_gone)
    with pytest.raises(QueueTimeout):
        await waiter
    assert len(q) == 0
    for s, _ in running:
        engine.abort(s.request_id, "client_gone")
    await q.stop()


async def test_client_leaving_at_the_moment_of_admission_gives_the_slot_back(engine, core):
    q = await _queue(engine, depth=2)
    gone = asyncio.Event()
    engine.on_admit = lambda rid: gone.set() if rid == "racer" else None  # leaves in the same tick
    with pytest.raises(ClientGone):
        await q.admit("racer", [1, 2, 3], LONG, gone.wait)
    engine.on_admit = None
    await asyncio.sleep(0.1)
    stats = core.stats()
    assert stats.num_running == 0 and stats.kv_blocks_used == 0
    await q.stop()


async def test_a_cancelled_waiter_leaves_the_queue_and_leaks_nothing(engine, core):
    q = await _queue(engine, depth=2)
    running = [await q.admit(f"hold-{i}", [1, 2, 3], LONG, _never_gone) for i in range(2)]
    waiter = asyncio.create_task(q.admit("cancelled", [1, 2, 3], SHORT, _never_gone))
    await asyncio.sleep(0.05)
    assert len(q) == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(q) == 0
    for s, _ in running:
        engine.abort(s.request_id, "client_gone")
    await asyncio.sleep(0.1)
    assert core.stats().kv_blocks_used == 0
    await q.stop()


async def test_capacity_signal_coalesces(engine):
    q = await _queue(engine)
    wakes = 0
    original = q._set_event

    def counting():
        nonlocal wakes
        wakes += 1
        original()

    q._set_event = counting
    threads = [threading.Thread(target=lambda: [q.signal_capacity() for _ in range(500)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    await asyncio.sleep(0.05)
    assert 1 <= wakes < 2000 / 10, f"{wakes} wake-ups for 2000 signals"
    await q.stop()
