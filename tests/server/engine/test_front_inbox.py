"""One engine process, several HTTP processes' pipes (engine/front_inbox.py): each client gets exactly its
own requests' tokens, the engine's stats reach every client and its step records only one, and a client
that leaves takes its requests with it while the others go on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from flotilla_server.engine.backends import spawn_engine
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.factory import connect_engine
from flotilla_server.engine.messages import EngineOptions
from flotilla_server.engine.sampling_params import SamplingParams

from tests.support.hf_models import random_prompts

from .conftest import DEVICE, run_to_completion
from .conftest import make_engine as make_core
from .test_client import until

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture
def llama(hf_model):
    return hf_model("llama")


@pytest.fixture
def fronts(llama):
    """Three clients over one engine process, as three HTTP processes hold them."""
    engine = spawn_engine(EngineConfig(model=str(llama[0]), device=DEVICE, max_num_seqs=4), EngineOptions(), fronts=3)
    clients = [connect_engine(conn, engine.info) for conn in engine.conns]
    for client in clients:
        client.start()
    yield engine, clients
    for client in clients:
        client.shutdown()
    engine.stop(10.0)


async def collect(stream) -> list:
    return [e async for e in stream]


def tokens(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def test_each_client_gets_exactly_its_own_tokens(llama, fronts) -> None:
    _, clients = fronts
    prompts = random_prompts([9, 17, 26, 12, 30, 7], seed=5)
    expected = run_to_completion(make_core(llama[1]), {f"r{i}": (p, GREEDY) for i, p in enumerate(prompts)})
    loop = asyncio.get_running_loop()
    records: list[list] = [[] for _ in clients]
    for client, seen in zip(clients, records, strict=True):
        client.add_step_listener(seen.append)
    # six requests over three clients, against four slots: some wait in the engine's queue
    streams = {f"r{i}": clients[i % 3].submit(f"r{i}", p, GREEDY, loop) for i, p in enumerate(prompts)}
    results = dict(zip(streams, await asyncio.gather(*(collect(s) for s in streams.values())), strict=True))
    for rid, events in results.items():
        assert tokens(events) == expected[rid]["token_ids"], rid
        assert events[-1].finish_reason == "length"
    assert records[0] and not records[1] and not records[2]  # step records once, to the first
    for client in clients:  # the stats reach every client (its reader thread, soon after), the last with nothing left
        await until(lambda c=client: c.stats().num_running == 0 and c.stats().kv_blocks_used == 0)
    assert all(sum(c.stats().queued_by_class.values()) == 0 for c in clients)


async def test_clients_that_leave_take_their_requests_and_the_others_finish_exactly(llama, fronts) -> None:
    engine, (first, second, third) = fronts
    prompt = random_prompts([21], seed=8)[0]
    long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    expected = run_to_completion(make_core(llama[1]), {"b": (prompt, GREEDY)})["b"]
    loop = asyncio.get_running_loop()
    leaving = first.submit("a", prompt, long, loop)
    staying = second.submit("b", prompt, GREEDY, loop)
    await asyncio.gather(leaving.admitted, staying.admitted)
    third.shutdown()  # nothing in flight: the engine must not wait for a message to step again
    first.shutdown()  # "a" is aborted, "b" goes on
    assert tokens(await collect(staying)) == expected["token_ids"]
    events = await collect(second.submit("c", prompt, GREEDY, loop))
    assert tokens(events) == expected["token_ids"]
    await until(lambda: second.stats().kv_blocks_used == 0)  # "a"'s blocks are free
    assert alive(engine.info.pid)
    second.shutdown()  # the last pipe: the engine process exits on its own
    engine.process.join(10)
    assert not alive(engine.info.pid)
