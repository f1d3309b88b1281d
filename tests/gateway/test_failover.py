"""The retry rule and outlier ejection, as tables and properties (failover.py, ejection.py)."""

from __future__ import annotations

import pytest
from flotilla_gateway.ejection import EjectionPolicy, Ejector
from flotilla_gateway.failover import (
    CONNECT_ERROR,
    DROPPED_BEFORE_BODY,
    POD_GONE,
    Attempt,
    RetryPolicy,
    decide_retry,
)
from hypothesis import given
from hypothesis import strategies as st

POLICY = RetryPolicy(max_retries=2, deadline_s=30.0)


@pytest.mark.parametrize(("attempt", "retry", "reason"), [
    (Attempt(CONNECT_ERROR, 0, 0.1, 2), True, "connect_error"),
    (Attempt(DROPPED_BEFORE_BODY, 0, 0.1, 2), True, "dropped_before_body"),
    (Attempt(POD_GONE, 1, 0.1, 1), True, "pod_gone"),
    (Attempt(502, 0, 0.1, 2), True, "502"),
    (Attempt(503, 0, 0.1, 2), True, "503"),  # draining
    (Attempt(429, 0, 0.1, 2, room_elsewhere=True), True, "429"),
    (Attempt(429, 0, 0.1, 2, room_elsewhere=False), False, "not_retryable:429"),  # every pod is full: say so
    (Attempt(504, 0, 0.1, 2), False, "not_retryable:504"),  # the pod took it and timed out
    (Attempt(500, 0, 0.1, 2), False, "not_retryable:500"),
    (Attempt(400, 0, 0.1, 2), False, "not_retryable:400"),  # the request is wrong everywhere
    (Attempt(CONNECT_ERROR, 2, 0.1, 2), False, "retries_spent:connect_error"),
    (Attempt(CONNECT_ERROR, 0, 30.0, 2), False, "deadline_spent:connect_error"),
    (Attempt(CONNECT_ERROR, 0, 0.1, 0), False, "no_other_pod:connect_error"),
])
def test_decide_retry(attempt: Attempt, retry: bool, reason: str) -> None:
    verdict = decide_retry(attempt, POLICY)
    assert (verdict.retry, verdict.reason) == (retry, reason)


def test_zero_retries_turns_retrying_off_and_bad_settings_are_refused() -> None:
    assert not decide_retry(Attempt(CONNECT_ERROR, 0, 0.0, 5), RetryPolicy(max_retries=0)).retry
    with pytest.raises(ValueError, match="--max-retries must be >= 0"):
        RetryPolicy(max_retries=-1)
    for deadline in (0.0, -1.0):
        with pytest.raises(ValueError, match="--retry-deadline-s must be above 0"):
            RetryPolicy(deadline_s=deadline)


@given(st.integers(0, 10), st.integers(0, 10), st.floats(0, 100), st.integers(0, 10))
def test_a_retry_never_breaks_a_bound(max_retries: int, done: int, elapsed_s: float, untried: int) -> None:
    policy = RetryPolicy(max_retries=max_retries, deadline_s=10.0)
    if decide_retry(Attempt(CONNECT_ERROR, done, elapsed_s, untried), policy).retry:
        assert done < max_retries and elapsed_s < 10.0 and untried > 0


PODS = ("a", "b", "c", "d")


def test_five_failures_in_a_row_eject_a_pod_for_its_cool_down_and_it_comes_back_from_zero() -> None:
    ejector = Ejector(EjectionPolicy(consecutive_failures=5, base_ejection_s=10.0, max_ejection_s=25.0))
    assert [ejector.failed("a", PODS, 0.0) for _ in range(5)] == [False] * 4 + [True]
    assert ejector.in_rotation(PODS, 1.0) == ["b", "c", "d"]
    assert ejector.in_rotation(PODS, 10.0) == list(PODS)  # back after 10 s, from zero failures
    assert [ejector.failed("a", PODS, 11.0) for _ in range(5)] == [False] * 4 + [True]
    assert ejector.ejected("a", 30.0)  # the second ejection lasts 2 x 10 s
    assert [ejector.failed("a", PODS, 31.0) for _ in range(5)][-1] and ejector.ejected("a", 55.0)  # capped at 25 s
    assert not ejector.ejected("a", 56.0)


def test_a_success_clears_the_count_and_the_cap_keeps_half_of_a_models_pods_in_rotation() -> None:
    ejector = Ejector(EjectionPolicy(consecutive_failures=2))
    ejector.failed("a", PODS, 0.0)
    ejector.succeeded("a")
    assert not ejector.failed("a", PODS, 0.0)  # one in a row again
    for pod in PODS:
        ejector.failed(pod, PODS, 0.0)
        ejector.failed(pod, PODS, 0.0)
    assert len(ejector.in_rotation(PODS, 1.0)) == 2  # four pods: at most two out
    lone = Ejector(EjectionPolicy(consecutive_failures=1))
    assert not lone.failed("only", ("only",), 0.0) and lone.in_rotation(("only",), 0.0) == ["only"]
    with pytest.raises(ValueError, match="--eject-after-failures must be >= 1"):
        EjectionPolicy(consecutive_failures=0)


@given(st.lists(st.tuples(st.sampled_from(PODS), st.booleans()), max_size=80),
       st.integers(1, 5), st.floats(0, 1))
def test_never_more_than_the_cap_is_out(events: list[tuple[str, bool]], failures: int, fraction: float) -> None:
    ejector = Ejector(EjectionPolicy(consecutive_failures=failures, max_ejected_fraction=fraction))
    for step, (pod, failed) in enumerate(events):
        now = step * 0.5  # cool-downs of 30 s and more: nothing comes back within the run
        if failed:
            ejector.failed(pod, PODS, now)
        else:
            ejector.succeeded(pod)
        assert len(PODS) - len(ejector.in_rotation(PODS, now)) <= int(fraction * len(PODS))
