"""rate_limit.RateLimiter: token buckets per key, one rule of docs/gateway.md ("Rate limits") per row, and the
properties the rules promise (never more than burst + refill, a Retry-After that is kept, keys apart)."""

from __future__ import annotations

import pytest
from flotilla_gateway.rate_limit import (
    SWEEP_INTERVAL_S,
    RateLimit,
    RateLimiter,
    bucket_size,
    duration,
    ratelimit_headers,
    retry_after,
)
from hypothesis import given, settings
from hypothesis import strategies as st


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def limiter(replicas: int = 1) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    return RateLimiter(replicas, clock), clock


REQUESTS = RateLimit(requests_per_min=60)
TOKENS = RateLimit(tokens_per_min=600)
BOTH = RateLimit(60, 600)


# (limit, costs sent at the same instant, then seconds waited, then the last cost) → the last decision
@pytest.mark.parametrize(("limit", "before", "wait_s", "cost", "admitted", "reason", "retry_s"), [
    (REQUESTS, [0] * 59, 0, 0, True, None, None),  # the burst is one minute's limit: 60 at once
    (REQUESTS, [0] * 60, 0, 0, False, "requests", 1.0),  # the 61st waits for one second's refill
    (REQUESTS, [0] * 60, 1.0, 0, True, None, None),
    (REQUESTS, [0] * 60, 0.25, 0, False, "requests", 0.75),
    (TOKENS, [500], 0, 100, True, None, None),
    (TOKENS, [500], 0, 101, False, "tokens", 0.1),  # 1 token short at 10 tokens/s
    (TOKENS, [], 0, 600, True, None, None),  # a whole minute's tokens at once
    (TOKENS, [], 0, 601, False, "too_large", None),  # more than the burst: never, so no retry time
    (TOKENS, [600], 30, 601, False, "too_large", None),
    (BOTH, [0] * 60, 0, 10, False, "requests", 1.0),
    (BOTH, [590], 0, 20, False, "tokens", 1.0),  # the slower bucket names the wait
    (BOTH, [0] * 59 + [595], 0, 20, False, "tokens", 1.5),
    (RateLimit(), [10**9], 0, 10**9, True, None, None),  # no limits: always admitted
])
def test_decide(limit: RateLimit, before: list[int], wait_s: float, cost: int, admitted: bool, reason: str | None,
                retry_s: float | None) -> None:
    rl, clock = limiter()
    for tokens in before:
        assert rl.decide("sk-a", limit, tokens).admitted
    clock.now_s += wait_s
    decision = rl.decide("sk-a", limit, cost)
    assert (decision.admitted, decision.reason) == (admitted, reason)
    assert decision.retry_after_s == pytest.approx(retry_s) if retry_s is not None else decision.retry_after_s is None


def test_a_refusal_charges_nothing() -> None:
    rl, clock = limiter()
    assert rl.decide("sk-a", BOTH, 600).admitted
    assert not rl.decide("sk-a", BOTH, 1).admitted
    clock.now_s += 0.1  # one token back
    assert rl.decide("sk-a", BOTH, 1).admitted  # the refused request took no request from its bucket
    assert rl.buckets[("sk-a", "requests")].level == pytest.approx(58.1)


@pytest.mark.parametrize(("reserved", "used", "unused", "level"), [
    (100, 100, 0, 500),
    (100, 40, 60, 560),  # the unused tokens go back
    (100, 0, 100, 600),  # no answer: all of them
    (100, 300, 0, 300),  # over-use is charged
    (600, 1500, 0, -900),  # and may take the bucket below zero
])
def test_reconcile(reserved: int, used: int, unused: int, level: int) -> None:
    rl, _ = limiter()
    decision = rl.decide("sk-a", TOKENS, reserved)
    assert decision.reservation is not None and decision.reservation.num_tokens == reserved
    assert rl.reconcile(decision.reservation, used) == unused
    assert rl.buckets[("sk-a", "tokens")].level == level


def test_a_bucket_in_debt_refuses_until_it_refilled() -> None:
    rl, clock = limiter()
    reservation = rl.decide("sk-a", TOKENS, 100).reservation
    assert reservation is not None
    rl.reconcile(reservation, 1100)  # 500 tokens of debt at 10 tokens/s
    decision = rl.decide("sk-a", TOKENS, 10)
    assert decision.reason == "tokens" and decision.retry_after_s == pytest.approx(51.0)
    clock.now_s += 51.0
    assert rl.decide("sk-a", TOKENS, 10).admitted


def test_refunds_never_fill_a_bucket_past_its_burst() -> None:
    rl, clock = limiter()
    reservation = rl.decide("sk-a", TOKENS, 300).reservation
    assert reservation is not None
    clock.now_s += 60
    assert rl.reconcile(reservation, 0) == 300
    assert rl.buckets[("sk-a", "tokens")].level == 600


def test_a_request_bucket_swept_while_a_request_ran_is_rebuilt_to_charge_its_over_use() -> None:
    rl, clock = limiter()
    reservation = rl.decide("sk-a", TOKENS, 100).reservation
    assert reservation is not None
    clock.now_s += SWEEP_INTERVAL_S + 1
    rl.decide("sk-b", TOKENS, 1)  # sweeps sk-a's bucket: it refilled to full
    assert ("sk-a", "tokens") not in rl.buckets
    rl.reconcile(reservation, 400)
    assert rl.buckets[("sk-a", "tokens")].level == 300


def test_each_of_n_replicas_enforces_a_share() -> None:
    assert bucket_size(600, "tokens", 3) == (200, pytest.approx(200 / 60))
    assert bucket_size(2, "requests", 3) == (1.0, pytest.approx(2 / 3 / 60))  # one request always fits
    rl, _ = limiter(replicas=3)
    assert rl.decide("sk-a", TOKENS, 200).admitted
    decision = rl.decide("sk-a", TOKENS, 201)
    assert decision.reason == "too_large"
    assert dict(decision.standings)["tokens"].limit == 200


def test_a_reloaded_limit_applies_at_once_and_what_was_used_stays_used() -> None:
    rl, _ = limiter()
    assert rl.decide("sk-a", TOKENS, 500).admitted  # 100 left
    assert not rl.decide("sk-a", RateLimit(tokens_per_min=1200), 200).admitted  # still 100 (+ a faster refill)
    assert rl.decide("sk-a", RateLimit(tokens_per_min=50), 50).admitted  # shrunk to 50: a full bucket of 50
    assert rl.decide("sk-a", REQUESTS, 10**6).admitted  # the token limit removed: its bucket goes
    assert ("sk-a", "tokens") not in rl.buckets


def test_headers_and_formats() -> None:
    rl, _ = limiter()
    decision = rl.decide("sk-a", BOTH, 90)
    assert ratelimit_headers(decision.standings) == {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "600",
        "x-ratelimit-remaining-tokens": "510", "x-ratelimit-reset-tokens": "9s"}
    assert [duration(s) for s in (0, 0.0004, 0.012, 1, 1.5, 59.9999, 360, 3723.25)] == [
        "0s", "1ms", "12ms", "1s", "1.5s", "1m0s", "6m0s", "1h2m3.25s"]
    assert [retry_after(s) for s in (0.01, 1.0, 1.2, 51)] == ["1", "1", "2", "51"]


# -- properties -----------------------------------------------------------------------------------------

steps = st.lists(st.tuples(st.floats(0, 30), st.integers(0, 700), st.integers(0, 1500)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(1, 4))
def test_never_more_than_the_burst_plus_the_refill(trace: list[tuple[float, int, int]], replicas: int) -> None:
    """Whatever arrives, the tokens charged (reservations, less what came back, plus over-use) since the
    start never exceed one burst plus the refill, beyond the debt that over-use left."""
    rl, clock = limiter(replicas)
    start_s, charged, admitted = clock.now_s, 0, 0
    capacity, refill_per_s = bucket_size(BOTH.tokens_per_min or 0, "tokens", replicas)
    requests_capacity, requests_refill_per_s = bucket_size(BOTH.requests_per_min or 0, "requests", replicas)
    for wait_s, cost, used in trace:
        clock.now_s += wait_s
        decision = rl.decide("sk-a", BOTH, cost)
        if decision.admitted:
            assert decision.reservation is not None
            admitted += 1
            unused = rl.reconcile(decision.reservation, used)
            assert unused == max(0, cost - used)
            charged += used
        level = rl.buckets[("sk-a", "tokens")].level
        assert level <= capacity
        elapsed_s = clock.now_s - start_s
        assert charged <= capacity + refill_per_s * elapsed_s - min(level, 0) + 1e-6
        assert admitted <= requests_capacity + requests_refill_per_s * elapsed_s + 1e-6


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 700)), max_size=40), st.integers(1, 700))
def test_a_retry_after_is_kept(trace: list[tuple[float, int]], cost: int) -> None:
    """A refused request sent again after its retry time, with nothing else in between, is admitted."""
    rl, clock = limiter()
    for wait_s, tokens in trace:
        clock.now_s += wait_s
        rl.decide("sk-a", BOTH, tokens)
    decision = rl.decide("sk-a", BOTH, cost)
    if decision.admitted or decision.reason == "too_large":
        assert decision.retry_after_s is None
        return
    assert decision.retry_after_s is not None and decision.retry_after_s > 0
    clock.now_s += decision.retry_after_s + 1e-9
    assert rl.decide("sk-a", BOTH, cost).admitted


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40).map(lambda quarters: quarters / 4), st.booleans(),
                          st.integers(0, 700)), max_size=60))
def test_keys_are_apart(trace: list[tuple[float, bool, int]]) -> None:
    """Key a's decisions are the same whatever key b sends in between (waits in quarter seconds keep the
    arithmetic exact, so "the same" is equality)."""
    alone, clock_alone = limiter()
    shared, clock_shared = limiter()
    for wait_s, is_b, cost in trace:
        clock_alone.now_s += wait_s
        clock_shared.now_s += wait_s
        if is_b:
            shared.decide("sk-b", BOTH, cost)
            continue
        assert alone.decide("sk-a", BOTH, cost) == shared.decide("sk-a", BOTH, cost)
