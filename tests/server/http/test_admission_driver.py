"""The HTTP side of admission against the real engine on tiny, in-process: exact races that HTTP timing cannot pin."""

from __future__ import annotations

import asyncio

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.factory import make_engine
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.http.admission import AdmissionQueue, ClientGone, QueueFull, QueueTimeout

LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


class _Hooked:
    """The real engine client, plus a callback the moment a request is admitted (to stage exact races)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.on_admit = None

    def submit(self, request_id, prompt_token_ids, params, loop, extra_prompts=()):
        stream = self.engine.submit(request_id, prompt_token_ids, params, loop, extra_prompts)
        if self.on_admit is not None:
            hook = self.on_admit
            stream.admitted.add_done_callback(lambda _: hook(request_id))
        return stream

    def abort(self, request_id, reason):
        self.engine.abort(request_id, reason)


@pytest.fixture(scope="module")
def client():
    e = make_engine(EngineConfig(max_num_seqs=2, max_model_len=512), "inprocess")
    e.start()
    yield e
    e.shutdown()


@pytest.fixture
def engine(client):
    yield _Hooked(client)


def _never_gone():
    return asyncio.Event().wait()


async def _idle(client) -> None:
    for _ in range(3000):
        s = client.stats()
        if s.num_running == 0 and s.kv_blocks_used == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine did not go idle: {client.stats()}")


async def _drain(stream) -> int:
    n = 0
    async for event in stream:
        n = event.num_output_tokens
    return n


async def test_fifo_admission_and_completion(engine):
    q = AdmissionQueue(engine, depth=4, queue_timeout_s=30.0)
    first = [asyncio.create_task(q.admit(f"fifo-{i}", [5, 6, 7], SHORT, _never_gone)) for i in range(4)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):  # four are counted as waiting before the engine has seen any of them
        await q.admit("fifo-over", [5, 6, 7], SHORT, _never_gone)
    results = await asyncio.gather(*first)
    assert await asyncio.gather(*(_drain(s) for s, _ in results)) == [4] * 4
    assert len(q) == 0


async def test_full_queue_refuses_at_once_and_a_wait_past_the_budget_times_out(engine, client):
    q = AdmissionQueue(engine, depth=1, queue_timeout_s=0.3)
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
    await _idle(client)


async def test_client_leaving_at_the_moment_of_admission_gives_the_slot_back(engine, client):
    q = AdmissionQueue(engine, depth=2, queue_timeout_s=30.0)
    gone = asyncio.Event()
    engine.on_admit = lambda rid: gone.set() if rid == "racer" else None  # leaves in the same tick
    with pytest.raises(ClientGone):
        await q.admit("racer", [1, 2, 3], LONG, gone.wait)
    engine.on_admit = None
    await _idle(client)


async def test_a_cancelled_waiter_leaves_the_queue_and_leaks_nothing(engine, client):
    q = AdmissionQueue(engine, depth=2, queue_timeout_s=30.0)
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
    await _idle(client)
