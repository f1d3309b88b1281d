"""The tier move's state machine (tier_moves.py): each phase as a table row, and over random observations the
invariants a make-before-break move promises: always served from a tier that is up, the route switched only
to a ready target, no rollback after the switch, Events in order, the tier changed only when the move is done."""

from __future__ import annotations

import pytest
from flotilla_operator import tier_moves as m
from flotilla_operator.tier_moves import Children, Move, MoveTimings, Seen, advance, settled, start
from flotilla_operator.tiering import DEDICATED, POOL
from hypothesis import given, settings
from hypothesis import strategies as st

T0 = 1_000.0
TIMINGS = MoveTimings(start_timeout_s=600, switch_grace_s=10, drain_timeout_s=300)
NONE_READY = Seen(dedicated_ready=0, dedicated_pods=0, pool_loaded=True)


def test_a_promotion_in_order() -> None:
    step = start(POOL, "SustainedDemand", 3, T0)
    assert step.event[0] == m.REASON_PROMOTION_STARTED and step.tier == POOL
    assert step.children == Children(pool_member=True, dedicated_replicas=3, routed_to_pool=True)
    # pods starting: the pool serves
    step = advance(POOL, step.move, Seen(2, 3, True), T0 + 30, TIMINGS)
    assert step.event is None and step.children.routed_to_pool and step.move.phase == m.STARTING
    # all 3 ready: the route switches to them, the pool member stays for the grace
    step = advance(POOL, step.move, Seen(3, 3, True), T0 + 60, TIMINGS)
    assert step.event[0] == m.REASON_ROUTE_SWITCHED and step.children == Children(True, 3, False)
    assert advance(POOL, step.move, Seen(3, 3, True), T0 + 65, TIMINGS).move.phase == m.SWITCHING
    # after the grace the member leaves the pool's list; the pool drains and unloads it
    step = advance(POOL, step.move, Seen(3, 3, True), T0 + 71, TIMINGS)
    assert step.event[0] == m.REASON_DRAINING and step.children == Children(False, 3, False)
    assert step.tier == POOL  # still moving
    step = advance(POOL, step.move, Seen(3, 3, False), T0 + 90, TIMINGS)
    assert step.event[0] == m.REASON_MOVE_DONE and step.move is None and step.tier == DEDICATED
    assert step.children == settled(DEDICATED, 3)


def test_a_demotion_in_order() -> None:
    step = start(DEDICATED, "DemandLow", 2, T0)
    assert step.event[0] == m.REASON_DEMOTION_STARTED and step.children == Children(True, 2, False)
    step = advance(DEDICATED, step.move, Seen(2, 2, False), T0 + 5, TIMINGS)
    assert step.move.phase == m.LOADING and not step.children.routed_to_pool
    step = advance(DEDICATED, step.move, Seen(2, 2, True), T0 + 20, TIMINGS)
    assert step.event[0] == m.REASON_ROUTE_SWITCHED and step.children == Children(True, 2, True)
    step = advance(DEDICATED, step.move, Seen(2, 2, True), T0 + 31, TIMINGS)
    assert step.event[0] == m.REASON_DRAINING and step.children == Children(True, 0, True)
    assert advance(DEDICATED, step.move, Seen(0, 1, True), T0 + 40, TIMINGS).move.phase == m.DRAINING
    step = advance(DEDICATED, step.move, Seen(0, 0, True), T0 + 50, TIMINGS)
    assert step.tier == POOL and step.move is None and step.children == settled(POOL, 0)


def test_a_promotion_whose_pods_never_start_rolls_back_degraded() -> None:
    move = start(POOL, "SloMissedInPool", 2, T0).move
    held = advance(POOL, move, Seen(1, 2, True), T0 + 600, TIMINGS)
    assert held.move is not None and held.degraded is None  # at the timeout itself, still waiting
    step = advance(POOL, move, Seen(1, 2, True), T0 + 601, TIMINGS)
    assert step.move is None and step.tier == POOL and step.degraded == m.DEGRADED_PROMOTION_FAILED
    assert step.event[0] == m.REASON_ROLLED_BACK and "1 of 2 dedicated replica(s) ready" in step.event[1]
    assert step.children == settled(POOL, 0)


def test_a_demotion_the_pool_never_loads_rolls_back_keeping_the_replicas() -> None:
    move = start(DEDICATED, "DemandLow", 4, T0).move
    step = advance(DEDICATED, move, Seen(4, 4, False), T0 + 700, TIMINGS)
    assert step.degraded == m.DEGRADED_DEMOTION_FAILED and step.tier == DEDICATED
    assert step.children == Children(False, 4, False)


def test_draining_waits_at_most_the_drain_timeout() -> None:
    move = Move(DEDICATED, m.DRAINING, T0, 2, "SustainedDemand")
    assert advance(POOL, move, Seen(2, 2, True), T0 + 300, TIMINGS).move is not None
    assert advance(POOL, move, Seen(2, 2, True), T0 + 301, TIMINGS).tier == DEDICATED


def test_a_move_resumes_from_what_status_recorded() -> None:
    """An operator restarted mid-promotion reads status.move and goes on: the answer depends on nothing else."""
    recorded = Move(DEDICATED, m.SWITCHING, T0, 2, "SustainedDemand")
    again = Move(**{f: getattr(recorded, f) for f in ("to", "phase", "phase_since_s", "replicas", "reason")})
    assert advance(POOL, recorded, Seen(2, 2, True), T0 + 20, TIMINGS) == advance(POOL, again, Seen(2, 2, True),
                                                                                T0 + 20, TIMINGS)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"to": "gpu", "phase": m.STARTING, "phase_since_s": 0.0}, "not a move"),
    ({"to": POOL, "phase": "Waiting", "phase_since_s": 0.0}, "not a move"),
    ({"to": DEDICATED, "phase": m.STARTING, "phase_since_s": 0.0, "replicas": 0}, "not a move"),
])
def test_a_move_out_of_range_is_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        Move(**kwargs)


# ---- invariants over random observations

seens = st.builds(Seen, dedicated_ready=st.integers(0, 4), dedicated_pods=st.integers(0, 4), pool_loaded=st.booleans())


@settings(max_examples=400, deadline=None)
@given(source=st.sampled_from([POOL, DEDICATED]), replicas=st.integers(1, 4),
       steps=st.lists(st.tuples(st.floats(0, 400), seens), min_size=1, max_size=30))
def test_invariants(source: str, replicas: int, steps: list[tuple[float, Seen]]) -> None:
    now = T0
    step = start(source, "R", replicas, now)
    events = [step.event[0]]
    target = DEDICATED if source == POOL else POOL
    target_was_ready = False
    for gap, seen in steps:
        if step.move is None:
            break
        now += gap
        before = step.move
        ready_now = seen.dedicated_ready >= before.replicas if target == DEDICATED else seen.pool_loaded
        step = advance(source, before, seen, now, TIMINGS)
        children = step.children
        # served from a tier that is up: the route names a tier whose children exist
        assert (children.pool_member if children.routed_to_pool else children.dedicated_replicas >= 1)
        if step.event is not None:
            events.append(step.event[0])
        if step.event is not None and step.event[0] == m.REASON_ROUTE_SWITCHED:
            target_was_ready = ready_now
            assert target_was_ready  # the route goes to a target seen ready
            assert children.routed_to_pool == (target == POOL)
        if before.phase in (m.SWITCHING, m.DRAINING):
            assert step.degraded is None  # no rollback after the switch
        if step.move is not None:
            assert step.tier == source
    started = m.REASON_PROMOTION_STARTED if source == POOL else m.REASON_DEMOTION_STARTED
    done = [started, m.REASON_ROUTE_SWITCHED, m.REASON_DRAINING, m.REASON_MOVE_DONE]
    assert events in (done[:len(events)], [started, m.REASON_ROLLED_BACK])
    if step.move is None:
        assert step.tier == (target if events[-1] == m.REASON_MOVE_DONE else source)
