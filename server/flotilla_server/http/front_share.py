"""One HTTP process's share of the server's limits when several serve one engine (`--http-processes`).

Why shares: each HTTP process answers a full queue with 429 from its own exact count, without asking the
others or the engine (http/admission.py). Splitting the queue's places between them keeps that: the
shares sum to the whole, so the queue never holds more than its capacity, and the kernel spreads
connections evenly over the processes' sockets (SO_REUSEPORT). The price: one process may refuse while
another still has a place. A per-tenant cap cannot be split below one place, so each process holds a
tenant to its share rounded up (docs/serving.md, "HTTP processes").
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FrontShare:
    index: int  # 0 .. count - 1
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"front {self.index} of {self.count}: the index must be in 0..{self.count - 1}")

    def of(self, total: int) -> int:
        """This process's part of `total` places: the parts differ by at most one and sum to `total`."""
        return total // self.count + (1 if self.index < total % self.count else 0)

    def of_cap(self, cap: int | None) -> int | None:
        """A per-tenant cap (None: none) as this process applies it: its share, rounded up, at least 1."""
        return None if cap is None else max(1, math.ceil(cap / self.count))
