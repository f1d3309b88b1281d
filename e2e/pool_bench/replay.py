"""Open-loop replay of the benchmark's trace through one base URL (the gateway): each request is sent at its
own time whether or not earlier ones have finished, as independent users send them, so a slow arm meets the
same arrivals as a fast one and its queues show in TTFT, not in a lower offered rate.

Each request streams a completion of exactly its output tokens (`ignore_eos`, `max_tokens`) from a prompt of
exactly its prompt tokens (token ids, no tokenizer in the way). TTFT is from the send to the first streamed
event that carries a choice. A request fails when it gets anything but 200, the stream ends without
`[DONE]`, or the connection breaks.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from e2e.pool_bench.trace import Request

BYTE_TOKENS = 256  # ids below this are tiny's byte tokens: any sequence of them is a valid prompt
REQUEST_TIMEOUT_S = 600.0
KEEPALIVE_EXPIRY_S = 1.0


@dataclass
class Result:
    model: str
    at_s: float  # scheduled send time, seconds from the replay's start
    sent_s: float  # time.monotonic() when sent
    first_token_s: float | None
    done_s: float | None
    status: int  # HTTP status; -1: the connection failed
    done: bool  # the stream ended with [DONE]
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s


def body(request: Request, index: int, seed: int) -> dict:
    rng = random.Random(seed * 1_000_003 + index)
    return {"model": request.model, "prompt": [rng.randrange(BYTE_TOKENS) for _ in range(request.prompt_tokens)],
            "max_tokens": request.output_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True}


async def one(client: httpx.AsyncClient, url: str, request: Request, payload: dict) -> Result:
    result = Result(request.model, request.at_s, time.monotonic(), None, None, 0, False)
    try:
        async with client.stream("POST", url + "/v1/completions", json=payload) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.error = (await response.aread()).decode(errors="replace")[:300]
            async for line in response.aiter_lines():
                if result.first_token_s is None and line.startswith("data: {") and '"choices"' in line:
                    result.first_token_s = time.monotonic()
                result.done = result.done or line == "data: [DONE]"
    except httpx.HTTPError as error:
        result.status, result.error = -1, repr(error)[:300]
    result.done_s = time.monotonic()
    return result


async def replay(url: str, requests: Sequence[Request], seed: int = 13) -> tuple[float, list[Result]]:
    """Every request at its time; returns the replay's start (time.monotonic()) and the results in trace order."""
    # idle connections expire before the gateway's (uvicorn's 5 s), so a request is never sent on a connection
    # the gateway is closing (a ReadError that no server saw)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        start_s = time.monotonic()

        async def at_its_time(i: int, request: Request) -> Result:
            payload = body(request, i, seed)
            await asyncio.sleep(max(0.0, start_s + request.at_s - time.monotonic()))
            return await one(client, url, request, payload)

        results = await asyncio.gather(*(at_its_time(i, r) for i, r in enumerate(requests)))
    return start_s, list(results)
