"""A closed-loop load generator that plays the Service: each request goes to a random ready replica.

It runs `concurrency` workers on its own event loop in a background thread, so a synchronous test
keeps watching the cluster while load runs. Every request is classified; the e2e suite requires that
each one either completes or gets 429 with `Retry-After`, and that none is lost or hangs.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

RETRY_PAUSE_CAP_S = 1.0  # a 429 pauses its worker for Retry-After, capped so the load keeps its level


@dataclass
class LoadReport:
    completed: int = 0
    rejected_429: int = 0  # with a valid Retry-After
    errors: list[str] = field(default_factory=list)  # anything else: lost, hung, 5xx, 429 without Retry-After

    @property
    def total(self) -> int:
        return self.completed + self.rejected_429 + len(self.errors)


class LoadGenerator:
    def __init__(self, endpoints: Callable[[], list[str]], model: str, concurrency: int, max_tokens: int = 24,
                 prompt: str = "Once upon a time, in a fleet of small servers,", request_timeout_s: float = 60.0,
                 seed: int = 0) -> None:
        self.endpoints = endpoints
        self.model = model
        self.concurrency = concurrency
        self.body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                     "ignore_eos": True}
        self.request_timeout_s = request_timeout_s
        self.report = LoadReport()
        self._random = random.Random(seed)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="load", daemon=True)

    def start(self) -> LoadGenerator:
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> LoadReport:
        """Stop issuing requests; wait for those in flight (each bounded by its timeout)."""
        self._stopping.set()
        self._thread.join(timeout_s if timeout_s is not None else self.request_timeout_s + 10)
        if self._thread.is_alive():
            self.report.errors.append("load generator did not stop: requests hang")
        return self.report

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=self.request_timeout_s) as client:
            await asyncio.gather(*(self._worker(client) for _ in range(self.concurrency)))

    async def _worker(self, client: httpx.AsyncClient) -> None:
        while not self._stopping.is_set():
            urls = self.endpoints()
            if not urls:
                await asyncio.sleep(0.1)
                continue
            pause_s = await self._one(client, self._random.choice(urls))
            if pause_s:
                await asyncio.sleep(pause_s)

    async def _one(self, client: httpx.AsyncClient, url: str) -> float:
        started = time.monotonic()
        try:
            response = await client.post(f"{url}/v1/completions", json=self.body)
        except httpx.TimeoutException:
            self.report.errors.append(f"{url}: no answer within {self.request_timeout_s}s (hung)")
            return 0.0
        except httpx.HTTPError as error:
            self.report.errors.append(f"{url}: lost after {time.monotonic() - started:.1f}s: {error!r}")
            return 0.0
        if response.status_code == 200:
            choices = response.json().get("choices") or [{}]
            if choices[0].get("finish_reason") in ("length", "stop"):
                self.report.completed += 1
            else:
                self.report.errors.append(f"{url}: 200 without a finish_reason: {response.text[:200]}")
            return 0.0
        if response.status_code == 429:
            retry_after = response.headers.get("Retry-After", "")
            if retry_after.isdigit() and int(retry_after) > 0:
                self.report.rejected_429 += 1
                return min(float(retry_after), RETRY_PAUSE_CAP_S)
            self.report.errors.append(f"{url}: 429 without a valid Retry-After ({retry_after!r})")
            return 0.0
        self.report.errors.append(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
        return 0.0
