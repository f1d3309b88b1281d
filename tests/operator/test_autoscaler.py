"""The autoscaler decision as a table: every rule of docs/autoscaling.md, one row per behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from flotilla_operator import autoscaler as a
from flotilla_operator.autoscaler import (
    AutoscalerState,
    Observation,
    PoolMetrics,
    Recommendation,
    ScalingSpec,
)
from flotilla_operator.autoscaler_status import (
    scaling_active,
    scaling_condition,
    starting_replicas,
    state_from_status,
    status_patch,
)

NOW = 1_800_000_000.0
S = 4  # slots per replica: cost-first T = 4 + 4 = 8, latency-first T = 0.75 * 4 = 3

COST = ScalingSpec(min_replicas=1, max_replicas=4, policy=a.COST_FIRST, target_queue_depth=4,
                   scale_down_stabilization_s=30, scale_to_zero_after_s=60)
COST_WIDE = replace(COST, max_replicas=20)
COST_ZERO = replace(COST, min_replicas=0)
LATENCY = ScalingSpec(min_replicas=1, max_replicas=8, policy=a.LATENCY_FIRST, scale_down_stabilization_s=30)


def pool(running: float, waiting: float, reporting: int = 1) -> PoolMetrics:
    return PoolMetrics(waiting=waiting, running=running, slots_per_replica=S, replicas_reporting=reporting)


def classed(running: float, waiting: float, running_batch: float, waiting_batch: float,
            reporting: int = 1) -> PoolMetrics:
    """Totals with the batch class's share of them (the flotilla_class_requests_* gauges)."""
    return PoolMetrics(waiting=waiting, running=running, slots_per_replica=S, replicas_reporting=reporting,
                       waiting_batch=waiting_batch, running_batch=running_batch)


def weighing(spec: ScalingSpec, w: float) -> ScalingSpec:
    return replace(spec, batch_demand_weight=w)


def history(*pairs: tuple[float, int]) -> AutoscalerState:
    """Recommendations given as (seconds ago, replicas)."""
    return AutoscalerState(tuple(Recommendation(NOW - ago, n) for ago, n in pairs))


def idle(seconds: float) -> AutoscalerState:
    """Idle for `seconds`, with a zero recommendation already in the window."""
    return AutoscalerState((Recommendation(NOW - min(seconds, 20), 0),), NOW - seconds)


@dataclass(frozen=True)
class Case:
    id: str
    spec: ScalingSpec
    metrics: PoolMetrics | None
    current: int
    want: int
    reason: str
    ready: int | None = None  # None: all current replicas ready
    starting: int = 0
    pending: int = 0
    state: AutoscalerState = field(default_factory=AutoscalerState)
    woken_ago_s: float | None = None  # a gateway woke the model this long ago


CASES = [
    # each policy's target
    Case("cost-first target S+targetQueueDepth", COST, pool(4, 12), 1, 2, a.REASON_SCALE_UP),  # ceil(16/8)
    Case("latency-first target 0.75*S", LATENCY, pool(4, 2), 1, 2, a.REASON_SCALE_UP),  # ceil(6/3)
    Case("same demand, latency-first wants more", LATENCY, pool(8, 8), 2, 6, a.REASON_SCALE_UP),  # ceil(16/3)
    Case("same demand, cost-first wants fewer", COST, pool(8, 8), 2, 2, a.REASON_STABLE),  # ceil(16/8)
    # tolerance: |D / (current*T) - 1| <= 10% holds
    Case("tolerance holds just above", COST, pool(8, 9), 2, 2, a.REASON_WITHIN_TOLERANCE),  # 17/16
    Case("beyond tolerance scales up", COST, pool(8, 10), 2, 3, a.REASON_SCALE_UP),  # 18/16
    Case("tolerance holds just below", COST_WIDE, pool(40, 32), 10, 10, a.REASON_WITHIN_TOLERANCE),  # 72/80
    Case("below tolerance scales down", COST_WIDE, pool(40, 31), 10, 9, a.REASON_SCALE_DOWN,
         state=history((20, 9))),  # 71/80
    # clamps
    Case("clamp at max", COST, pool(4, 96), 4, 4, a.REASON_STABLE),
    Case("clamp at min", replace(COST, min_replicas=2), pool(0, 0, 2), 2, 2, a.REASON_STABLE),
    Case("above max after a spec edit", COST, pool(4, 0, 6), 6, 4, a.REASON_OUT_OF_BOUNDS),
    Case("below min after a spec edit", replace(COST, min_replicas=3), pool(4, 0), 1, 3, a.REASON_OUT_OF_BOUNDS),
    # scale-up rate limit: one step adds at most max(current, 4)
    Case("rate limit from 1", COST_WIDE, pool(4, 96), 1, 5, a.REASON_SCALE_UP_RATE_LIMITED),
    Case("rate limit doubles", COST_WIDE, pool(24, 176, 6), 6, 12, a.REASON_SCALE_UP_RATE_LIMITED),
    Case("scale-up window takes the lowest", replace(COST, scale_up_stabilization_s=10), pool(4, 28), 1, 2,
         a.REASON_SCALE_UP, state=history((5, 2))),
    Case("scale-up window holds", replace(COST, scale_up_stabilization_s=10), pool(4, 28), 1, 1,
         a.REASON_SCALE_UP_STABILIZING, state=history((5, 1))),
    # scale-down stabilization window: the highest recommendation in the window wins
    Case("window holds a scale-down", COST, pool(0, 0, 4), 4, 4, a.REASON_SCALE_DOWN_STABILIZING,
         state=history((10, 4))),
    Case("window passed", COST, pool(0, 0, 4), 4, 1, a.REASON_SCALE_DOWN, state=history((40, 4), (20, 1))),
    Case("first sight waits a full window", COST, pool(0, 0, 4), 4, 4, a.REASON_SCALE_DOWN_STABILIZING),
    Case("highest in window wins", COST, pool(0, 0, 4), 4, 3, a.REASON_SCALE_DOWN,
         state=history((50, 4), (20, 3), (5, 2))),
    # pending guard: starting replicas are capacity to come
    Case("pending replicas hold scale-up", COST, pool(4, 36), 3, 3, a.REASON_PENDING_REPLICAS, ready=1, starting=2),
    Case("ready replicas release the guard", COST, pool(12, 28, 3), 3, 4, a.REASON_SCALE_UP),
    # missing metrics hold
    Case("query failed holds", COST, None, 3, 3, a.REASON_METRICS_UNAVAILABLE),
    Case("no series while ready holds", COST, pool(0, 0, 0), 2, 2, a.REASON_METRICS_UNAVAILABLE),
    Case("missing metrics never scale to zero", COST_ZERO, None, 1, 1, a.REASON_METRICS_UNAVAILABLE,
         state=AutoscalerState((), NOW - 3600)),
    # scale to zero: cost-first only, after the idle window
    Case("zero after idle window", COST_ZERO, pool(0, 0), 1, 0, a.REASON_SCALE_TO_ZERO,
         state=idle(61)),
    Case("idle window not over", COST_ZERO, pool(0, 0), 1, 1, a.REASON_IDLE_WINDOW,
         state=idle(30)),
    Case("down to 1 before zero", COST_ZERO, pool(0, 0, 3), 3, 1, a.REASON_SCALE_DOWN,
         state=idle(5)),
    Case("cost-first min 1 stays at 1", COST, pool(0, 0), 1, 1, a.REASON_STABLE,
         state=AutoscalerState((), NOW - 3600)),
    Case("latency-first never below 1", replace(LATENCY, min_replicas=0), pool(0, 0), 1, 1, a.REASON_STABLE,
         state=AutoscalerState((), NOW - 3600)),
    Case("zero stays zero", COST_ZERO, pool(0, 0, 0), 0, 0, a.REASON_STABLE, ready=0),
    Case("pending demand wakes from zero", COST_ZERO, pool(0, 0, 0), 0, 1, a.REASON_SCALE_UP, ready=0, pending=3),
    Case("pending demand sized by target", COST_ZERO, pool(0, 0, 0), 0, 3, a.REASON_SCALE_UP, ready=0, pending=20),
    Case("held requests keep a model from zero", COST_ZERO, pool(0, 0), 1, 1, a.REASON_STABLE, pending=1,
         state=idle(3600)),
    Case("a fresh wake keeps a model from zero", COST_ZERO, pool(0, 0), 1, 1, a.REASON_IDLE_WINDOW,
         state=idle(3600), woken_ago_s=30),
    Case("an old wake does not", COST_ZERO, pool(0, 0), 1, 0, a.REASON_SCALE_TO_ZERO, state=idle(3600),
         woken_ago_s=61),
    # batch demand (scaling.batchDemandWeight w): Q - (1-w)*Qb and R - (1-w)*Rb, interactive at 1
    Case("a batch flood does not scale out (w=0)", COST_WIDE, classed(4, 96, 4, 96), 1, 1, a.REASON_STABLE),
    Case("interactive beside the flood still scales", COST_WIDE, classed(4, 96, 2, 80), 1, 3, a.REASON_SCALE_UP),
    # ceil((2 + 16) / 8) = 3: only the interactive 2 running and 16 waiting count
    Case("w=1 counts batch in full", weighing(COST_WIDE, 1), classed(4, 96, 4, 96), 1, 5,
         a.REASON_SCALE_UP_RATE_LIMITED),  # as pool(4, 96)
    Case("w=0.5 counts half", weighing(COST_WIDE, 0.5), classed(4, 36, 4, 36), 1, 3, a.REASON_SCALE_UP),
    # (4 - 2) + (36 - 18) = 20, ceil(20/8) = 3
    Case("no class series: an older server counts everything", COST_WIDE, pool(4, 96), 1, 5,
         a.REASON_SCALE_UP_RATE_LIMITED),
    Case("batch-only work keeps a cost-first model from zero", COST_ZERO, classed(4, 10, 4, 10), 1, 1,
         a.REASON_STABLE, state=idle(3600)),
    Case("batch-only work shrinks to 1, not to 0", COST_ZERO, classed(8, 20, 8, 20, 3), 3, 1, a.REASON_SCALE_DOWN,
         state=history((40, 3), (20, 1))),
    Case("latency-first: batch does not eat the headroom", LATENCY, classed(4, 0, 3, 0), 1, 1, a.REASON_STABLE),
    Case("class gauges a request ahead of the totals never go negative", COST, classed(0, 0, 1, 2), 1, 1,
         a.REASON_STABLE),
    # restart: the history read back from status keeps the window
    Case("restart keeps the window", COST, pool(0, 0, 4), 4, 4, a.REASON_SCALE_DOWN_STABILIZING,
         state=state_from_status(status_patch(
             a.Decision(4, a.REASON_SCALE_UP, "", history((10, 4))), 1, 0, NOW - 10, None))),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decision_table(case: Case) -> None:
    ready = case.current if case.ready is None else case.ready
    woken_at = NOW - case.woken_ago_s if case.woken_ago_s is not None else None
    obs = Observation(case.metrics, case.current, ready, case.starting, NOW, case.pending, woken_at)
    decision = a.decide(case.spec, obs, case.state)
    assert (decision.desired_replicas, decision.reason) == (case.want, case.reason), decision.message
    assert str(case.current) in decision.message  # the numbers travel with the reason


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 20


def test_missing_metrics_keep_history_untouched() -> None:
    state = history((10, 4))
    decision = a.decide(COST, Observation(None, 4, 4, 0, NOW), state)
    assert decision.state == state and decision.recommendation is None


def test_reason_carries_the_numbers() -> None:
    decision = a.decide(COST, Observation(pool(4, 12), 1, 1, 0, NOW), AutoscalerState())
    for text in ("R=4", "Q=12", "S=4", "T=8", "ceil((R+Q+P)/T)=2", "current=1"):
        assert text in decision.message


def test_batch_numbers_travel_with_the_reason() -> None:
    decision = a.decide(weighing(COST, 0.25), Observation(classed(6, 12, 4, 8), 1, 1, 0, NOW), AutoscalerState())
    for text in ("R=3 Q=6", "Rb=4 Qb=8", "w=0.25", "ceil((R+Q+P)/T)=2"):  # 6-0.75*4, 12-0.75*8
        assert text in decision.message, decision.message
    plain = a.decide(COST, Observation(pool(4, 12), 1, 1, 0, NOW), AutoscalerState())
    assert "Rb=" not in plain.message  # no batch work, no batch numbers


def test_batch_work_stops_the_idle_clock() -> None:
    idle_state = a.decide(COST_ZERO, Observation(pool(0, 0), 1, 1, 0, NOW), AutoscalerState()).state
    busy = a.decide(COST_ZERO, Observation(classed(1, 0, 1, 0), 1, 1, 0, NOW + 5), idle_state)
    assert busy.state.idle_since_s is None and busy.recommendation == 1


@pytest.mark.parametrize("w", [0.0, 0.3, 1.0])
def test_weighted_demand_is_the_formula(w: float) -> None:
    m = classed(running=10, waiting=30, running_batch=6, waiting_batch=20)
    assert a.weighted_demand(weighing(COST, w), m) == pytest.approx((10 - (1 - w) * 6, 30 - (1 - w) * 20))


def test_idle_clock_starts_and_resets() -> None:
    idle = a.decide(COST_ZERO, Observation(pool(0, 0), 1, 1, 0, NOW), AutoscalerState())
    assert idle.state.idle_since_s == NOW
    later = a.decide(COST_ZERO, Observation(pool(0, 0), 1, 1, 0, NOW + 5), idle.state)
    assert later.state.idle_since_s == NOW  # the clock keeps its start while idle
    busy = a.decide(COST_ZERO, Observation(pool(1, 0), 1, 1, 0, NOW + 6), later.state)
    assert busy.state.idle_since_s is None


def test_history_is_trimmed_to_the_longest_window() -> None:
    state = history((100, 4), (29, 3), (1, 2))
    decision = a.decide(COST, Observation(pool(0, 0, 4), 4, 4, 0, NOW), state)
    assert [r.replicas for r in decision.state.recommendations] == [3, 2, 1]


def test_status_round_trip() -> None:
    state = AutoscalerState((Recommendation(NOW - 3, 2), Recommendation(NOW, 3)), NOW - 7)
    patch = status_patch(a.Decision(3, a.REASON_SCALE_UP, "m", state), 2, 5, NOW, None)
    assert patch["lastScaleTime"] is not None and patch["queueDepth"] == 5
    back = state_from_status(patch)
    assert [r.replicas for r in back.recommendations] == [2, 3]
    assert abs(back.recommendations[0].time_s - (NOW - 3)) < 0.01 and abs(back.idle_since_s - (NOW - 7)) < 0.01


def test_unreadable_status_entries_are_dropped() -> None:
    back = state_from_status({"recommendations": [{"time": "garbage", "replicas": 2}, {"replicas": 1}],
                              "idleSince": "nope"})
    assert back == AutoscalerState()


@pytest.mark.parametrize("bad", [
    dict(min_replicas=3, max_replicas=2), dict(min_replicas=0, max_replicas=1, policy="fastest"),
    dict(min_replicas=0, max_replicas=1, target_queue_depth=-1),
    dict(min_replicas=0, max_replicas=1, scale_down_stabilization_s=-1),
    dict(min_replicas=0, max_replicas=1, batch_demand_weight=1.5),
    dict(min_replicas=0, max_replicas=1, batch_demand_weight=-0.1),
])
def test_invalid_spec_says_what_to_change(bad: dict) -> None:
    with pytest.raises(ValueError, match=r"scaling|policy"):
        ScalingSpec(**bad)


@pytest.mark.parametrize(("current", "deployment", "want"), [
    (3, None, 3),  # no Deployment yet: everything is still to come
    (3, {"status": {"readyReplicas": 1}}, 2),
    (1, {"status": {"readyReplicas": 3}}, 0),  # shrinking
    (3, {"status": {"readyReplicas": 1, "conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}}, 0),
])
def test_starting_replicas(current: int, deployment: dict | None, want: int) -> None:
    assert starting_replicas(current, deployment) == want


def test_scaling_condition_keeps_others_and_transition_time() -> None:
    others = [{"type": "Ready", "status": "True"}]
    first = scaling_condition(others, True, "ValidMetricFound", "m", "t1", 1)
    again = scaling_condition(first, True, "ValidMetricFound", "m2", "t2", 1)
    flipped = scaling_condition(again, False, "MetricsUnavailable", "m3", "t3", 1)
    assert again[0] == others[0] and again[1]["lastTransitionTime"] == "t1" and again[1]["message"] == "m2"
    assert flipped[1]["lastTransitionTime"] == "t3" and scaling_active(flipped) is False
    assert scaling_active(others) is None
