"""Answers at the door before work inside: a request let in starts its work once the door is quiet.

Why: under a burst, a refusal is one write of prepared bytes (~60 µs of the event loop), while a request
let in runs the whole handler (validation, tokenization, the streaming response's tasks: ~1 ms). Measured
with 200 requests at once against 4 slots on tiny (36 let in): the HTTP process ran ~45 ms of the burst's
first 60 ms, and the refusals read after the first requests let in had started waited behind them. With
the requests let in waiting for the door, the 429s' p95 fell from 61 to 34 ms in the process mode and from
47 to 30 ms in-process (docs/benchmarks.md, "Engine modes"). A request let in loses little by waiting:
most of a burst's requests let in wait for a slot in the queue anyway.

One watcher looks at the door for every request waiting, once a turn: when each request looked for itself,
the 36 requests let in ran 36 task steps on every turn of the loop, and a burst's refusals, read a few per
turn, left a median 90 µs apart against ~30 µs of their own work. With one watcher the 429s' p95 fell from
37 to 24 ms in the process mode and from 27 to 23 ms in-process (median of 9, docs/benchmarks.md).

Rules:
- every generation request that reaches the door counts as an arrival, refused or let in;
- a request let in waits until one turn of the event loop has passed with no arrival (each turn polls the
  sockets once, so a burst's requests already sent are read and refused before it goes on), or at most
  `MAX_WAIT_S` from the first of the requests waiting with it, so that a steady stream of refusals delays
  a request let in by no more than that;
- a request that arrives alone goes on after one turn of the loop;
- a waiting request that is cancelled (its client left) leaves the others waiting.
"""

from __future__ import annotations

import asyncio

MAX_WAIT_S = 0.05


class DoorTraffic:
    def __init__(self, max_wait_s: float = MAX_WAIT_S) -> None:
        self.arrivals = 0
        self.max_wait_s = max_wait_s
        self._waiting: list[asyncio.Future[None]] = []  # non-empty while the watcher runs

    def arrived(self) -> None:
        self.arrivals += 1

    async def until_quiet(self) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiting.append(waiter)
        if len(self._waiting) == 1:
            loop.call_soon(self._watch, loop, self.arrivals, loop.time() + self.max_wait_s)
        await waiter

    def _watch(self, loop: asyncio.AbstractEventLoop, seen: int, deadline: float) -> None:
        """Once a turn: let every waiting request go on when no request arrived since the last turn."""
        if self.arrivals != seen and loop.time() < deadline:
            loop.call_soon(self._watch, loop, self.arrivals, deadline)
            return
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)
