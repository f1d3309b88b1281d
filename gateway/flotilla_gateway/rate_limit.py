"""Token buckets per API key, for requests and tokens per minute: the pure decision behind the gateway's rate
limits, apart from HTTP so that it can be driven by a table, by hypothesis and by a clock the test holds.

Rules (docs/gateway.md, "Rate limits"):
- a key has one bucket per limit it names (requestsPerMinute, tokensPerMinute); a key without limits has none;
- the burst is one minute's limit: a bucket holds at most `limit` and refills continuously at limit/60 per
  second, so in any T seconds a key gets at most limit × (1 + T/60). A bucket the gateway has not seen yet
  (a new key, or any key after a restart) starts full;
- with N gateway replicas (--rate-limit-replicas), each replica's buckets hold and refill limit/N; a request
  bucket holds at least one request, so a replica never refuses a key for ever;
- a request costs one request and its reserved tokens; it is admitted only when every bucket holds its cost,
  and then all of them are charged at once;
- a cost above a bucket's capacity can never fit: it is refused without a time to retry;
- at the end the reservation is reconciled with the tokens used: unused ones go back (never above capacity),
  over-use is charged and may take the bucket below zero, so later requests wait until it refills.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

SECONDS_PER_MIN = 60.0
SWEEP_INTERVAL_S = 60.0  # how often buckets that refilled to full are dropped (a full bucket equals a new one)
Kind = Literal["requests", "tokens"]
KINDS: tuple[Kind, ...] = ("requests", "tokens")
# why a request was refused: a bucket short of its cost (it refills), or a cost no bucket can ever hold
Reason = Literal["requests", "tokens", "too_large"]


@dataclass(frozen=True)
class RateLimit:
    """A key's limits as the keys file states them; None: no limit of that kind."""

    requests_per_min: int | None = None
    tokens_per_min: int | None = None

    def __post_init__(self) -> None:
        for value in (self.requests_per_min, self.tokens_per_min):
            assert value is None or value > 0, "a limit is a count above 0 (keys.py refuses the rest)"

    def per_min(self, kind: Kind) -> int | None:
        return self.requests_per_min if kind == "requests" else self.tokens_per_min


NO_LIMIT = RateLimit()


@dataclass
class Bucket:
    capacity: float  # the burst: one minute's limit, per replica
    refill_per_s: float
    level: float  # may fall below 0 after over-use; never above capacity once refilled
    updated_s: float

    def refill(self, now_s: float) -> None:
        if now_s > self.updated_s:  # a clock that steps back refills nothing
            self.level = min(self.capacity, self.level + (now_s - self.updated_s) * self.refill_per_s)
            self.updated_s = now_s

    def wait_s(self, amount: float) -> float:
        """Seconds until the bucket holds `amount` (≤ capacity), with no other charge in between."""
        return max(0.0, (amount - self.level) / self.refill_per_s)


@dataclass(frozen=True)
class Standing:
    """One bucket as OpenAI's x-ratelimit-* headers show it."""

    limit: int  # what this replica allows per minute
    remaining: int  # whole units left now, never below 0
    reset_s: float  # until the bucket is full again


@dataclass(frozen=True)
class Reservation:
    key: str
    num_tokens: int  # tokens charged at admission; 0 when the key has no token limit
    capacity: float  # the token bucket's, to rebuild it if it was swept while the request ran
    refill_per_s: float


@dataclass(frozen=True)
class Decision:
    admitted: bool
    reason: Reason | None = None  # why refused; None when admitted
    retry_after_s: float | None = None  # refused: when the same request would fit; None: never, or admitted
    reservation: Reservation | None = None  # admitted with a token limit: what reconcile settles
    standings: tuple[tuple[Kind, Standing], ...] = ()  # after the charge when admitted


def bucket_size(per_min: float, kind: Kind, replicas: int) -> tuple[float, float]:
    """(capacity, refill per second) of one replica's bucket for a limit of `per_min`."""
    share = per_min / replicas
    capacity = max(1.0, share) if kind == "requests" else share  # one request always fits a replica
    return capacity, share / SECONDS_PER_MIN


class RateLimiter:
    """Every key's buckets on this replica; `clock` is monotonic seconds (a test passes its own)."""

    def __init__(self, replicas: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        assert replicas >= 1
        self.replicas = replicas
        self.clock = clock
        self.buckets: dict[tuple[str, Kind], Bucket] = {}  # (API key, kind) → its bucket
        self._swept_s = clock()

    def capacity(self, limit: RateLimit, kind: Kind) -> float | None:
        per_min = limit.per_min(kind)
        return None if per_min is None else bucket_size(per_min, kind, self.replicas)[0]

    def decide(self, key: str, limit: RateLimit, num_tokens: int) -> Decision:
        """Admit a request of `num_tokens` reserved tokens for `key` (charging its buckets), or say why not."""
        now_s = self.clock()
        self._sweep(now_s)
        costs = {"requests": 1, "tokens": num_tokens}
        held: list[tuple[Kind, Bucket]] = []
        for kind in KINDS:
            per_min = limit.per_min(kind)
            if per_min is None:
                self.buckets.pop((key, kind), None)  # the limit was removed from the keys file
            else:
                held.append((kind, self._bucket(key, kind, per_min, now_s)))
        if not held:
            return Decision(admitted=True)
        too_large = [kind for kind, bucket in held if costs[kind] > bucket.capacity]
        if too_large:
            return Decision(False, "too_large", None, None, self._standings(held))
        waits = {kind: bucket.wait_s(costs[kind]) for kind, bucket in held}
        slowest = max(waits, key=lambda kind: waits[kind])
        if waits[slowest] > 0:
            return Decision(False, slowest, waits[slowest], None, self._standings(held))
        for kind, bucket in held:
            bucket.level -= costs[kind]
        tokens = dict(held).get("tokens")
        reservation = None if tokens is None else Reservation(key, num_tokens, tokens.capacity, tokens.refill_per_s)
        return Decision(True, None, None, reservation, self._standings(held))

    def reconcile(self, reservation: Reservation, used_tokens: int) -> int:
        """Settle a reservation with the tokens the request used; the unused tokens given back (≥ 0).
        Over-use is charged in full."""
        now_s = self.clock()
        unused = max(0, reservation.num_tokens - used_tokens)
        over = max(0, used_tokens - reservation.num_tokens)
        bucket = self.buckets.get((reservation.key, "tokens"))
        if bucket is None:  # swept while the request ran, so it was full: rebuild it to charge any over-use
            if over == 0:
                return unused
            bucket = Bucket(reservation.capacity, reservation.refill_per_s, reservation.capacity, now_s)
            self.buckets[(reservation.key, "tokens")] = bucket
        bucket.refill(now_s)
        bucket.level = min(bucket.capacity, bucket.level + unused - over)
        return unused

    def _bucket(self, key: str, kind: Kind, per_min: int, now_s: float) -> Bucket:
        capacity, refill_per_s = bucket_size(per_min, kind, self.replicas)
        bucket = self.buckets.get((key, kind))
        if bucket is None:
            bucket = self.buckets[(key, kind)] = Bucket(capacity, refill_per_s, capacity, now_s)
        bucket.refill(now_s)
        if (bucket.capacity, bucket.refill_per_s) != (capacity, refill_per_s):  # a reloaded keys file changed it
            bucket.capacity, bucket.refill_per_s = capacity, refill_per_s
            bucket.level = min(bucket.level, capacity)  # what was used stays used
        return bucket

    def _standings(self, held: list[tuple[Kind, Bucket]]) -> tuple[tuple[Kind, Standing], ...]:
        return tuple((kind, Standing(math.floor(b.capacity), max(0, math.floor(b.level)),
                                     (b.capacity - b.level) / b.refill_per_s)) for kind, b in held)

    def _sweep(self, now_s: float) -> None:
        """Drop buckets that refilled to full: a full bucket is what a new one would be, so nothing changes,
        and the keys a reload removed stop costing memory."""
        if now_s - self._swept_s < SWEEP_INTERVAL_S:
            return
        self._swept_s = now_s
        for name, bucket in list(self.buckets.items()):
            bucket.refill(now_s)
            if bucket.level >= bucket.capacity:
                del self.buckets[name]


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: "20ms", "1.5s", "6m0s", "1h2m3s"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    seconds = round(seconds, 3)  # milliseconds at most, so 59.9999 reads 1m0s rather than 60s
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    secs_text = f"{secs:.3f}".rstrip("0").rstrip(".")
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{secs_text}s"
    if minutes >= 1:
        return f"{int(minutes)}m{secs_text}s"
    return f"{secs_text}s"


def ratelimit_headers(standings: tuple[tuple[Kind, Standing], ...]) -> dict[str, str]:
    """OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} for the limits a key has."""
    headers = {}
    for kind, standing in standings:
        headers[f"x-ratelimit-limit-{kind}"] = str(standing.limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(standing.remaining)
        headers[f"x-ratelimit-reset-{kind}"] = duration(standing.reset_s)
    return headers


def retry_after(seconds: float) -> str:
    """Retry-After in whole seconds (HTTP's delay-seconds), rounded up so a client that obeys it fits."""
    return str(max(1, math.ceil(seconds)))
