"""Answers at the door before work inside: a request let in starts its work once the door is quiet.

Why: under a burst, a refusal is one write of prepared bytes (~60 µs of the event loop), while a request
let in runs the whole handler (validation, tokenization, the streaming response's tasks: ~1 ms). Measured
with 200 requests at once against 4 slots on tiny (36 let in): the HTTP process ran ~45 ms of the burst's
first 60 ms, and the refusals read after the first requests let in had started waited behind them. With
the requests let in waiting for the door, the 429s' p95 fell from 61 to 34 ms in the process mode and from
47 to 30 ms in-process (docs/benchmarks.md, "Engine modes"). A request let in loses little by waiting:
most of a burst's requests let in wait for a slot in the queue anyway.

Rules:
- every generation request that reaches the door counts as an arrival, refused or let in;
- a request let in waits until one turn of the event loop has passed with no arrival (each turn polls the
  sockets once, so a burst's requests already sent are read and refused before it goes on), or at most
  `MAX_WAIT_S`, so that a steady stream of refusals delays a request let in by no more than that;
- a request that arrives alone goes on after one turn of the loop.
"""

from __future__ import annotations

import asyncio

MAX_WAIT_S = 0.05


class DoorTraffic:
    def __init__(self, max_wait_s: float = MAX_WAIT_S) -> None:
        self.arrivals = 0
        self.max_wait_s = max_wait_s

    def arrived(self) -> None:
        self.arrivals += 1

    async def until_quiet(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while True:
            seen = self.arrivals
            await asyncio.sleep(0)  # one turn: the loop polls its sockets before this task runs again
            if self.arrivals == seen or loop.time() >= deadline:
                return
