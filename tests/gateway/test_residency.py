"""residency.place: ModelMesh's order and the second copy, as a table of pool states and as properties."""

from __future__ import annotations

import pytest
from flotilla_gateway.residency import SECOND_COPY_AFTER_S, Residence, place, waiting_per_copy
from flotilla_gateway.routing import PodView
from hypothesis import given
from hypothesis import strategies as st

GiB = 2**30
NOW = 1000.0


def pod(name: str, *, state: str | None = "available", waiting: int = 0, free: int = 0, lru: float | None = None,
        saturated: bool = False, load: int = 0) -> Residence:
    view = PodView(name, in_flight=load, slots=4, queue_capacity=32, load_age_s=None if saturated else 0.1)
    return Residence(view, state=state, model_waiting=waiting, model_bytes=GiB, free_bytes=free, lru_idle_s=lru)  # type: ignore[arg-type]


def names(placement) -> list[str]:
    return sorted(p.address for p in placement.pods)


@pytest.mark.parametrize(("pods", "tier", "chosen"), [
    ([pod("a", state="loaded"), pod("b", state="loading"), pod("c", free=2 * GiB)], "loaded", ["a"]),
    ([pod("a", state="loaded"), pod("b", state="loaded")], "loaded", ["a", "b"]),  # the policy picks among them
    ([pod("a", lru=50), pod("b", state="loading"), pod("c", free=2 * GiB)], "loading", ["b"]),
    ([pod("a", lru=50, free=GiB // 2), pod("b", free=GiB), pod("c", free=2 * GiB)], "free", ["b", "c"]),
    ([pod("a", lru=50), pod("b", lru=900), pod("c", lru=900), pod("d")], "lru", ["b", "c"]),  # the oldest LRU model
    ([pod("a"), pod("b")], "busy", ["a", "b"]),  # nothing idle anywhere: every pod makes it wait
    # saturation still filters: a full pod holding the model loses to one that loads it
    ([pod("a", state="loaded", saturated=True), pod("b", free=2 * GiB)], "free", ["b"]),
    ([pod("a", state="loaded", saturated=True), pod("b", saturated=True)], "loaded", ["a"]),  # all saturated: all count
    # a pod that does not list the model (members file not re-read yet) is a last resort
    ([pod("a", state=None, free=2 * GiB), pod("b", lru=5)], "lru", ["b"]),
    ([pod("a", state=None), pod("b", state=None)], "unlisted", ["a", "b"]),
])
def test_tiers_in_modelmesh_order(pods: list[Residence], tier: str, chosen: list[str]) -> None:
    placement = place(pods, target_waiting=8, pressed_since_s=None, now_s=NOW)
    assert (placement.tier, names(placement)) == (tier, chosen)


def test_a_second_copy_only_after_the_pressure_lasts() -> None:
    pods = [pod("a", state="loaded", waiting=10), pod("b", free=2 * GiB), pod("c", lru=100)]
    first = place(pods, target_waiting=8, pressed_since_s=None, now_s=NOW)
    assert (first.tier, names(first), first.pressed_since_s) == ("loaded", ["a"], NOW)  # the clock starts
    early = place(pods, 8, first.pressed_since_s, NOW + SECOND_COPY_AFTER_S / 2)
    assert (early.tier, early.pressed_since_s) == ("loaded", NOW)
    due = place(pods, 8, first.pressed_since_s, NOW + SECOND_COPY_AFTER_S)
    assert (due.tier, names(due)) == ("second_copy", ["b"])  # the pod with free budget loads a second copy
    assert due.pressed_since_s == NOW + SECOND_COPY_AFTER_S  # the clock restarts: one copy per window


@pytest.mark.parametrize(("pods", "tier", "pressed"), [
    ([pod("a", state="loaded", waiting=8), pod("b", free=2 * GiB)], "loaded", False),  # at target is not above it
    ([pod("a", state="loaded", waiting=20), pod("b", state="loading", waiting=0), pod("c", free=2 * GiB)],
     "second_copy", True),  # 20 over 2 copies is 10 each
    ([pod("a", state="loaded", waiting=9), pod("b", lru=100)], "loaded", True),  # no free budget: no copy
    ([pod("a", state="loaded", waiting=9), pod("b", free=2 * GiB, saturated=True)], "loaded", True),
    ([pod("a", waiting=0, free=2 * GiB)], "free", False),  # no copy yet: no pressure
])
def test_second_copy_needs_pressure_and_a_free_unsaturated_pod(pods: list[Residence], tier: str, pressed: bool) -> None:
    placement = place(pods, target_waiting=8, pressed_since_s=NOW - 60, now_s=NOW)
    assert placement.tier == tier
    assert (placement.pressed_since_s is not None) == pressed


def test_waiting_per_copy() -> None:
    assert waiting_per_copy([pod("a", state="loaded", waiting=3), pod("b", state="loading", waiting=5),
                             pod("c", waiting=40)]) == 4.0
    assert waiting_per_copy([pod("a")]) is None


residences = st.builds(
    lambda i, state, waiting, free, lru, saturated, load: pod(
        f"p{i}", state=state, waiting=waiting, free=free, lru=lru, saturated=saturated, load=load),
    st.integers(0, 5), st.sampled_from([None, "available", "loading", "loaded"]), st.integers(0, 20),
    st.sampled_from([0, GiB // 2, GiB, 3 * GiB]), st.one_of(st.none(), st.floats(0, 1e4)), st.booleans(),
    st.integers(0, 10))
pools = st.lists(residences, min_size=1, max_size=6, unique_by=lambda r: r.pod.address)


@given(pools, st.floats(0, 16), st.one_of(st.none(), st.floats(0, NOW)))
def test_properties(pods: list[Residence], target: float, since: float | None) -> None:
    placement = place(pods, target, since, NOW)
    by_address = {r.pod.address: r for r in pods}
    chosen = [by_address[p.address] for p in placement.pods]
    assert chosen, "a non-empty pool always has somewhere to go"
    listed = [r for r in pods if r.state is not None]
    if listed:
        assert all(r.state is not None for r in chosen)  # unlisted pods only when none lists the model
        fresh = [r for r in listed if r.pod.load_age_s is not None]
        if fresh:
            assert all(r.pod.load_age_s is not None for r in chosen)  # saturated pods only when all are
        tier_of = {"loaded": lambda r: r.state == "loaded", "loading": lambda r: r.state == "loading",
                   "free": lambda r: r.has_room, "second_copy": lambda r: not r.is_copy and r.has_room}
        if placement.tier in tier_of:
            assert all(tier_of[placement.tier](r) for r in chosen)
        if placement.tier not in ("second_copy",) and any(r.state == "loaded" for r in fresh or listed):
            assert placement.tier == "loaded"  # a pod holding it always wins, unless a second copy starts
    per_copy = waiting_per_copy(pods)
    pressed = per_copy is not None and per_copy > target
    assert (placement.pressed_since_s is not None) == pressed
    if placement.tier == "second_copy":
        assert placement.pressed_since_s == NOW and since is not None and NOW - since >= SECOND_COPY_AFTER_S
    elif pressed:
        assert placement.pressed_since_s == (since if since is not None else NOW)
