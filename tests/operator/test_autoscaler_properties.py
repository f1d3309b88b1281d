"""Invariants of the autoscaler decision over random inputs, and a simulated load cycle with no flapping."""

from __future__ import annotations

import itertools

from flotilla_operator import autoscaler as a
from flotilla_operator.autoscaler import (
    AutoscalerState,
    Observation,
    PoolMetrics,
    Recommendation,
    ScalingSpec,
)
from hypothesis import given, settings
from hypothesis import strategies as st

NOW = 1_800_000_000.0


@st.composite
def specs(draw: st.DrawFn) -> ScalingSpec:
    policy = draw(st.sampled_from(a.POLICIES))
    low = draw(st.integers(0 if policy == a.COST_FIRST else 1, 6))
    return ScalingSpec(
        min_replicas=low,
        max_replicas=draw(st.integers(max(low, 1), 30)),
        policy=policy,
        target_queue_depth=draw(st.integers(0, 16)),
        scale_up_stabilization_s=draw(st.sampled_from([0, 10, 60])),
        scale_down_stabilization_s=draw(st.sampled_from([0, 30, 300])),
        scale_to_zero_after_s=draw(st.sampled_from([0, 60, 600])),
    )


metrics = st.one_of(
    st.none(),
    st.builds(PoolMetrics, waiting=st.integers(0, 500), running=st.integers(0, 200),
              slots_per_replica=st.integers(1, 64), replicas_reporting=st.integers(0, 30)),
)
states = st.builds(
    AutoscalerState,
    recommendations=st.lists(
        st.builds(Recommendation, time_s=st.floats(NOW - 400, NOW), replicas=st.integers(0, 30)), max_size=8
    ).map(lambda rs: tuple(sorted(rs, key=lambda r: r.time_s))),
    idle_since_s=st.one_of(st.none(), st.floats(NOW - 900, NOW)),
)


@settings(max_examples=400, deadline=None)
@given(spec=specs(), m=metrics, current=st.integers(0, 30), ready=st.integers(0, 30), starting=st.integers(0, 5),
       pending=st.integers(0, 50), state=states)
def test_invariants(spec: ScalingSpec, m: PoolMetrics | None, current: int, ready: int, starting: int,
                    pending: int, state: AutoscalerState) -> None:
    ready = min(ready, current)
    d = a.decide(spec, Observation(m, current, ready, starting, NOW, pending), state)
    if d.reason == a.REASON_METRICS_UNAVAILABLE:
        assert d.desired_replicas == current and d.state == state  # missing data holds, remembers nothing
        return
    in_bounds = a.floor_replicas(spec) <= current <= spec.max_replicas
    assert a.floor_replicas(spec) <= d.desired_replicas <= spec.max_replicas
    if spec.policy == a.LATENCY_FIRST:
        assert d.desired_replicas >= 1
    if in_bounds and d.desired_replicas > current:
        assert d.desired_replicas <= a.scale_up_limit(current) and starting == 0
    if in_bounds and d.desired_replicas < current:
        window = [r.replicas for r in d.state.recommendations if r.time_s >= NOW - spec.scale_down_stabilization_s]
        assert d.desired_replicas >= max(window)  # never under a recommendation still in the window
    if in_bounds and d.desired_replicas == 0 < current:
        assert spec.policy == a.COST_FIRST and d.state.idle_since_s is not None
        assert NOW - d.state.idle_since_s >= spec.scale_to_zero_after_s


def simulate(spec: ScalingSpec, demand_at, seconds: int, interval_s: int = 5, load_s: int = 20) -> list[int]:
    """Replicas after each tick; new replicas are ready `load_s` after the scale-up that made them."""
    replicas, state, ready_at, series = 1, AutoscalerState(), [], []
    for t in range(0, seconds, interval_s):
        now = NOW + t
        ready = min(replicas, 1 + sum(1 for r in ready_at if r <= now)) if replicas else 0
        m = PoolMetrics(waiting=max(demand_at(t) - ready * 4, 0), running=min(demand_at(t), ready * 4),
                        slots_per_replica=4, replicas_reporting=ready)
        d = a.decide(spec, Observation(m, replicas, ready, replicas - ready, now), state)
        if d.desired_replicas > replicas:
            ready_at += [now + load_s] * (d.desired_replicas - replicas)
        else:
            ready_at = sorted(ready_at)[: max(d.desired_replicas - 1, 0)]
        replicas, state = d.desired_replicas, d.state
        series.append(replicas)
    return series


def monotone(series: list[int]) -> bool:
    rises = [b - a_ for a_, b in itertools.pairwise(series)]
    return all(x >= 0 for x in rises) or all(x <= 0 for x in rises)


def test_load_cycle_scales_up_then_down_without_flapping() -> None:
    spec = ScalingSpec(min_replicas=1, max_replicas=4, policy=a.COST_FIRST, target_queue_depth=4,
                       scale_down_stabilization_s=60)
    noisy = [24, 22, 26, 23, 25, 21, 24, 26]  # ~3x one replica's target of 8, with jitter

    def demand_at(t: int) -> int:
        if t < 120:
            return noisy[(t // 5) % len(noisy)]
        return [0, 1, 0, 0, 2, 0][(t // 5) % 6]  # a trickle after the load stops

    series = simulate(spec, demand_at, 300)
    up, down = series[: 120 // 5], series[120 // 5:]
    assert monotone(up) and monotone(down), series
    assert max(up) >= 3 and series[2] >= 3  # three intervals of the queue appearing
    assert down[: 55 // 5] == [max(up)] * (55 // 5)  # nothing drops inside the 60 s window
    assert series[-1] == 1


def test_slow_cold_start_does_not_cascade() -> None:
    spec = ScalingSpec(min_replicas=1, max_replicas=10, policy=a.COST_FIRST, target_queue_depth=4,
                       scale_down_stabilization_s=60)
    series = simulate(spec, lambda t: 24 + t // 5, 60, load_s=40)  # the queue grows while replicas load
    assert series[:8] == [3] * 8  # no step while the first three are still starting


@st.composite
def classed_metrics(draw: st.DrawFn) -> PoolMetrics:
    """Totals and the batch class's share of them, as the flotilla_class_requests_* gauges report it."""
    waiting_batch, running_batch = draw(st.integers(0, 400)), draw(st.integers(0, 100))
    return PoolMetrics(waiting=waiting_batch + draw(st.integers(0, 100)), running=running_batch + draw(st.integers(0, 100)),
                       slots_per_replica=draw(st.integers(1, 64)), replicas_reporting=draw(st.integers(1, 30)),
                       waiting_batch=waiting_batch, running_batch=running_batch)


@settings(max_examples=300, deadline=None)
@given(spec=specs(), m=classed_metrics(), current=st.integers(1, 30), w=st.floats(0, 1), w2=st.floats(0, 1))
def test_batch_weight_only_lowers_demand(spec: ScalingSpec, m: PoolMetrics, current: int, w: float, w2: float) -> None:
    """A lower batchDemandWeight never recommends more; w=0 recommends what the interactive work alone
    would (at least 1 while batch work remains); w=1 what the totals alone would, as before classes."""
    def recommend(weight: float, metrics: PoolMetrics) -> int | None:
        spec_w = ScalingSpec(**{**spec.__dict__, "batch_demand_weight": weight})
        return a.decide(spec_w, Observation(metrics, current, current, 0, NOW), AutoscalerState()).recommendation

    low, high = sorted((w, w2))
    assert recommend(low, m) <= recommend(high, m)
    interactive = PoolMetrics(m.waiting - m.waiting_batch, m.running - m.running_batch, m.slots_per_replica,
                              m.replicas_reporting)
    batch_only = interactive.waiting + interactive.running == 0 < m.waiting + m.running
    one = min(max(1, a.floor_replicas(spec)), spec.max_replicas)  # batch work alone keeps one replica
    assert recommend(0.0, m) == (one if batch_only else recommend(1.0, interactive))
    totals = PoolMetrics(m.waiting, m.running, m.slots_per_replica, m.replicas_reporting)
    assert recommend(1.0, m) == recommend(1.0, totals)
