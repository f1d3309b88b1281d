"""A disconnect storm: 6 rounds of 48 concurrent streams, half of which leave at random moments. Every stream
that stays gets exactly the text it gets alone, ending with `length`; nothing is a 5xx; every block comes back.

Before the engine applied aborts only between steps, a departure between a step's plan and its execution
failed every request in that batch with engine_error."""

from __future__ import annotations

import asyncio
import json
import random
import time
from urllib.parse import urlparse

import httpx

from tests.server.http import raw_http

ROUNDS, STREAMS, PROMPTS, MAX_TOKENS = 6, 48, 8, 24


def _body(i: int, stream: bool) -> dict:
    return {"model": "tiny", "prompt": f"storm prompt {i % PROMPTS}: the sea", "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": stream}


def test_disconnect_storm(server):
    url = urlparse(server.base_url)
    alone = {}
    for p in range(PROMPTS):
        choice = httpx.post(f"{server.base_url}/v1/completions", json=_body(p, False), timeout=60).json()["choices"][0]
        assert choice["finish_reason"] == "length"
        alone[p] = choice["text"]
    rng = random.Random(10)

    async def client(i: int, leave_after: int | None) -> tuple[str, int, str | None, str]:
        reader, writer = await raw_http.connect(url.hostname, url.port)
        writer.write(raw_http.request_bytes(url.hostname, url.port, "/v1/completions", _body(i, True)))
        await writer.drain()
        try:
            if leave_after == 0:
                await asyncio.sleep(rng.uniform(0, 0.05))
                return "left", 0, None, ""
            head = await raw_http.read_head(reader, time.monotonic())
            text, finish, seen = "", None, 0
            while True:
                line = await reader.readline()
                if not line or line.startswith(b"data: [DONE]"):
                    break
                if not line.startswith(b"data: {"):
                    continue
                seen += 1
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
                if leave_after is not None and seen >= leave_after:
                    return "left", head.status, None, ""
            return "stayed", head.status, finish, text
        finally:
            if i % 2:
                writer.transport.abort()
            else:
                writer.close()

    async def round_() -> list:
        plans = [None if rng.random() < 0.5 else rng.randint(0, 20) for _ in range(STREAMS)]
        return await asyncio.gather(*(client(i, plan) for i, plan in enumerate(plans)))

    for _ in range(ROUNDS):
        results = asyncio.run(round_())
        for i, (kind, status, finish, text) in enumerate(results):
            assert status in (0, 200), status
            if kind == "stayed":
                assert (finish, text) == ("length", alone[i % PROMPTS]), (i, finish, text)

    def settled() -> bool:
        m = server.metrics()
        return m.get(("flotilla_kv_blocks_used", ()), -1) == 0 and m.get(("flotilla_requests_running", ()), -1) == 0

    deadline = time.monotonic() + 30
    while not settled():
        assert time.monotonic() < deadline, server.metrics()
        time.sleep(0.1)
    m = server.metrics()
    assert not [k for k in m if k[0] == "flotilla_requests_total" and k[1][0][1].startswith("5")], m
    assert "engine_error" not in server.log()
