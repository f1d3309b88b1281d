"""The load of the gateway's cost benchmark (bench/overhead.py): streams paced on schedules of their own, or
read as fast as the upstream writes, each chunk's age noted on arrival."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Load:
    """One run's figures as the client saw them."""

    chunks: int = 0
    seconds: float = 0.0
    ages_s: list[float] = field(default_factory=list)  # each chunk's age on arrival (the upstream stamps its send)


async def _stream(session: aiohttp.ClientSession, url: str, model: str, chunks: int, load: Load) -> None:
    body = {"model": model, "prompt": "x", "max_tokens": chunks, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            if line.startswith(b"data: {"):
                load.ages_s.append((time.monotonic_ns() - json.loads(line[6:])["t_ns"]) / 1e9)
                load.chunks += 1


async def run_streams(url: str, model: str, streams: int, requests_per_stream: int, request_chunks: int,
                      phase_s: float = 0.0, seed: int = 0) -> Load:
    """`streams` clients, each sending `requests_per_stream` streamed requests of `request_chunks` chunks back to
    back; each starts after a random offset in [0, phase_s), so paced streams keep schedules of their own
    (the upstream paces each answer from its arrival) instead of sending their chunks in bursts."""
    load = Load()
    rng = random.Random(seed)
    offsets = [rng.uniform(0, phase_s) for _ in range(streams)]

    async def client(session: aiohttp.ClientSession, offset_s: float) -> None:
        await asyncio.sleep(offset_s)
        for _ in range(requests_per_stream):
            await _stream(session, url, model, request_chunks, load)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session, offset) for offset in offsets))
        load.seconds = time.perf_counter() - started
    return load
