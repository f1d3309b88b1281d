"""The admission queue's pure decisions: FIFO, bounded depth, bounded overtaking of a blocked head."""

from __future__ import annotations

import pytest
from flotilla_server.engine.admission_policy import AdmissionPolicy
from hypothesis import given, settings
from hypothesis import strategies as st


def _capacity(free: int, sizes: dict[str, int]):
    """A capacity oracle: admits an item if its size fits what is left, and takes it."""
    left = [free]

    def try_admit(item: str) -> bool:
        if sizes[item] <= left[0]:
            left[0] -= sizes[item]
            return True
        return False

    return try_admit


def test_fifo_when_everyone_fits():
    q: AdmissionPolicy[str] = AdmissionPolicy(depth=4, max_overtakes=2)
    for x in "abc":
        q.push(x)
    assert q.admit_round(lambda _: True) == ["a", "b", "c"]
    assert len(q) == 0


def test_full_queue_refuses_push():
    q: AdmissionPolicy[str] = AdmissionPolicy(depth=2, max_overtakes=1)
    q.push("a")
    q.push("b")
    assert q.is_full()
    with pytest.raises(OverflowError):
        q.push("c")


def test_zero_depth_is_always_full():
    assert AdmissionPolicy(depth=0, max_overtakes=1).is_full()


def test_stops_at_blocked_head_when_no_overtaking_allowed():
    q: AdmissionPolicy[str] = AdmissionPolicy(depth=8, max_overtakes=0)
    for x in "abc":
        q.push(x)
    assert q.admit_round(_capacity(2, {"a": 5, "b": 1, "c": 1})) == []
    assert list(q) == ["a", "b", "c"]


def test_later_small_requests_overtake_a_blocked_head_at_most_k_times():
    q: AdmissionPolicy[str] = AdmissionPolicy(depth=8, max_overtakes=2)
    for x in "abcde":
        q.push(x)
    sizes = {"a": 10, "b": 1, "c": 1, "d": 1, "e": 1}
    assert q.admit_round(_capacity(100 - 90, {**sizes, "a": 11})) == ["b", "c"]
    assert q.head_overtaken() == 2
    # the head now reserves capacity: nobody behind it enters, even with room for them
    assert q.admit_round(_capacity(3, sizes)) == []
    assert q.admit_round(_capacity(12, sizes)) == ["a", "d", "e"]


def test_overtake_count_belongs_to_the_head_and_resets_with_a_new_head():
    q: AdmissionPolicy[str] = AdmissionPolicy(depth=8, max_overtakes=1)
    for x in "abcd":
        q.push(x)
    assert q.admit_round(_capacity(1, {"a": 5, "b": 1, "c": 1, "d": 1})) == ["b"]
    assert q.admit_round(_capacity(5, {"a": 5, "b": 1, "c": 9, "d": 1})) == ["a"]
    assert q.head_overtaken() == 0  # c is the head now, nobody has overtaken it
    assert q.admit_round(_capacity(1, {"a": 5, "b": 1, "c": 9, "d": 1})) == ["d"]


def test_remove_gives_up_a_waiter_and_is_idempotent():
    q: AdmissionPolicy[str] = AdmissionPolicy(depth=3, max_overtakes=1)
    for x in "abc":
        q.push(x)
    assert q.remove("b")
    assert not q.remove("b")
    assert list(q) == ["a", "c"]
    assert not q.is_full()


def test_scan_limit_bounds_tries_behind_the_head():
    q: AdmissionPolicy[str] = AdmissionPolicy(depth=8, max_overtakes=5, scan_limit=2)
    for x in "abcdef":
        q.push(x)
    tried: list[str] = []

    def try_admit(x: str) -> bool:
        tried.append(x)
        return False

    q.admit_round(try_admit)
    assert tried == ["a", "b", "c"]


def test_rejects_negative_configuration():
    with pytest.raises(ValueError, match="depth"):
        AdmissionPolicy(depth=-1, max_overtakes=1)
    with pytest.raises(ValueError, match="max_overtakes"):
        AdmissionPolicy(depth=1, max_overtakes=-1)


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(0, 4),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    capacities=st.lists(st.integers(0, 10), min_size=1, max_size=20),
)
def test_properties_no_loss_no_duplicates_bounded_overtaking_head_progress(k, sizes, capacities):
    q: AdmissionPolicy[int] = AdmissionPolicy(depth=len(sizes), max_overtakes=k)
    for i in range(len(sizes)):
        q.push(i)
    admitted: list[int] = []
    overtakes: dict[int, int] = {}  # head ticket -> later arrivals admitted while it was the head
    waiting = set(range(len(sizes)))
    for free in [*capacities, 10**6]:  # a last round with room for everyone
        for x in q.admit_round(_capacity(free, dict(enumerate(sizes)))):
            head = min(waiting)
            if x != head:
                overtakes[head] = overtakes.get(head, 0) + 1
            waiting.remove(x)
            admitted.append(x)
    assert sorted(admitted) == list(range(len(sizes)))  # nobody lost, nobody twice
    assert len(q) == 0
    assert all(n <= k for n in overtakes.values()), overtakes
    if k == 0:
        assert admitted == sorted(admitted)  # no overtaking at all: strict FIFO
