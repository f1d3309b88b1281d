"""Invariants of the SLO scaler over random inputs, and a simulated load step with no flapping."""

from __future__ import annotations

import itertools
import math

from flotilla_operator import autoscaler as a
from flotilla_operator import slo_scaler as s
from flotilla_operator.autoscaler import PoolMetrics, Recommendation, ScalingSpec
from flotilla_operator.slo_scaler import LatencySample, SloObservation, SloState, SloTargets
from hypothesis import given, settings
from hypothesis import strategies as st

NOW = 1_800_000_000.0
WINDOW_S = 20.0


@st.composite
def specs(draw: st.DrawFn) -> ScalingSpec:
    policy = draw(st.sampled_from(a.POLICIES))
    low = draw(st.integers(0 if policy == a.COST_FIRST else 1, 5))
    return ScalingSpec(min_replicas=low, max_replicas=draw(st.integers(max(low, 1), 30)), policy=policy,
                       scale_down_stabilization_s=draw(st.sampled_from([0, 30, 300])))


def mostly(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """`strategy`, or None one time in ten: a failed query is a case, not the usual one."""
    return st.tuples(st.sampled_from([True] * 9 + [False]), strategy).map(lambda pair: pair[1] if pair[0] else None)


targets = st.builds(SloTargets, ttft_s=st.sampled_from([0.2, 1.0]), tpot_s=st.sampled_from([None, 0.05]),
                    window_s=st.just(WINDOW_S))
latencies = mostly(st.builds(
    LatencySample, requests=st.integers(0, 500),
    ttft_s=st.one_of(st.none(), st.floats(0.001, 60)), tpot_s=st.one_of(st.none(), st.floats(0.0005, 2.5))))
loads = mostly(st.builds(PoolMetrics, waiting=st.integers(0, 40), running=st.integers(0, 60),
                         slots_per_replica=st.integers(1, 16), replicas_reporting=st.integers(0, 30).map(lambda n: n or 30)))
ago = st.one_of(st.none(), st.floats(0, 100).map(lambda x: NOW - x))
states = st.builds(
    SloState,
    recommendations=st.lists(st.builds(Recommendation, time_s=st.floats(NOW - 400, NOW), replicas=st.integers(0, 30)),
                             max_size=6).map(lambda rs: tuple(sorted(rs, key=lambda r: r.time_s))),
    ready_seen=st.one_of(st.none(), st.integers(0, 30)), ready_grew_at_s=ago, scaled_down_at_s=ago)


@settings(max_examples=600, deadline=None)
@given(spec=specs(), slo=targets, latency=latencies, load=loads, current=st.integers(0, 32),
       ready=st.integers(0, 30), starting=st.integers(0, 5), state=states)
def test_invariants(spec: ScalingSpec, slo: SloTargets, latency: LatencySample | None, load: PoolMetrics | None,
                    current: int, ready: int, starting: int, state: SloState) -> None:
    current = a.floor_replicas(spec) + current % (spec.max_replicas + 2)  # mostly within the bounds, at times past
    ready = min(ready, current)
    d = s.decide_slo(spec, slo, SloObservation(latency, load, current, ready, starting, NOW), state)
    if d.reason in s.HOLDS:
        assert d.desired_replicas == current and d.state == state  # missing data holds, remembers nothing
        return
    assert a.floor_replicas(spec) <= d.desired_replicas <= spec.max_replicas
    if not a.floor_replicas(spec) <= current <= spec.max_replicas:
        return  # clamped at once, whatever was measured
    assert latency is not None and load is not None and d.signal is not None
    grew = d.state.ready_grew_at_s
    if d.desired_replicas > current:
        assert d.signal > s.SCALE_UP_ABOVE  # fast up, only on a miss (or close to one)
        assert d.desired_replicas <= a.scale_up_limit(current)  # a bound on the step
        assert grew is None or NOW - grew >= slo.window_s  # never on a window older than the newest capacity
        if load.waiting > 0 and starting == 0:  # a slot shortage: the slots for everything in flight, or one more
            slots = math.ceil((load.running + load.waiting) / (s.SLOT_FILL * load.slots_per_replica) - 1e-9)
            assert d.desired_replicas <= max(slots, current + 1)
        else:  # the miss on the ready replicas, against every replica asked for: only the deficit
            credited = math.ceil(max(ready, 1) * min(d.signal, s.SIGNAL_CAP) / s.SCALE_UP_ABOVE - 1e-9)
            assert d.desired_replicas <= credited
    if d.desired_replicas < current:
        assert d.signal < s.SCALE_DOWN_BELOW  # slow down, only with headroom
        in_flight = load.running + load.waiting
        assert d.desired_replicas * s.SLOT_FILL * load.slots_per_replica >= in_flight - 1e-9  # every request a slot
        window = [r.replicas for r in d.state.recommendations if r.time_s >= NOW - spec.scale_down_stabilization_s]
        assert d.desired_replicas >= max(window)  # never under a recommendation still in the window
        for since in (state.scaled_down_at_s, grew):
            assert since is None or NOW - since >= slo.window_s  # never twice within one window


@settings(max_examples=300, deadline=None)
@given(spec=specs(), load=loads.filter(lambda m: m is not None and m.replicas_reporting > 0), current=st.integers(1, 30), state=states,
       low=st.floats(0.001, 30), high=st.floats(0.001, 30))
def test_worse_latency_never_asks_for_fewer_replicas(spec: ScalingSpec, load: PoolMetrics, current: int,
                                                     state: SloState, low: float, high: float) -> None:
    low, high = sorted((low, high))
    slo = SloTargets(ttft_s=1.0, window_s=WINDOW_S)

    def want(ttft: float) -> int:
        obs = SloObservation(LatencySample(50, ttft), load, current, current, 0, NOW)
        return s.decide_slo(spec, slo, obs, state).desired_replicas

    assert want(low) <= want(high)


def closed_loop(clients: int, seconds: int, interval_s: int = 2, start_s: int = 10, slots: int = 2,
                service_s: float = 0.8, replicas: int = 1, state: SloState = SloState()) -> tuple[list[int], SloState]:
    """`clients` workers that send again as soon as answered, on replicas of `slots` that each serve a request in
    `service_s`; a new replica serves `start_s` after the scale-up. TTFT is the queue ahead over the drain rate,
    as measured over the window (a 2 s pure delay stands for the scrape and the rate window's lag)."""
    spec = ScalingSpec(1, 4, a.COST_FIRST, target_queue_depth=16, scale_down_stabilization_s=12)
    slo = SloTargets(ttft_s=0.5, window_s=10)
    ready_at: list[float] = []
    series, seen_ttft = [], []
    for t in range(0, seconds, interval_s):
        now = NOW + t
        ready = min(replicas, 1 + sum(1 for r in ready_at if r <= now))
        waiting = max(clients - ready * slots, 0)
        drain_per_s = ready * slots / service_s
        seen_ttft.append(0.02 + waiting / drain_per_s if clients else None)
        ttft = seen_ttft[-2] if len(seen_ttft) > 1 else seen_ttft[-1]
        latency = LatencySample(10.0 if clients else 0.0, ttft)
        load = PoolMetrics(waiting, min(clients, ready * slots), slots, ready)
        d = s.decide_slo(spec, slo, SloObservation(latency, load, replicas, ready, replicas - ready, now), state)
        if d.desired_replicas > replicas:
            ready_at += [now + start_s] * (d.desired_replicas - replicas)
        elif d.desired_replicas < replicas:
            ready_at = ready_at[: max(d.desired_replicas - 1, 0)]
        replicas, state = d.desired_replicas, d.state
        series.append(replicas)
    return series, state


def test_a_load_step_scales_up_once_holds_without_flapping_and_leaves() -> None:
    loaded, state = closed_loop(clients=5, seconds=60)
    assert loaded[0] > 1  # the first tick sees the queue's TTFT and scales up
    assert all(b >= a for a, b in itertools.pairwise(loaded))  # never down while the load lasts
    assert len(set(loaded)) <= 3  # at most two steps up, then steady
    assert loaded[-1] * 2 >= 5  # steady where every client has a slot
    quiet, _ = closed_loop(clients=0, seconds=40, replicas=loaded[-1], state=state)
    assert quiet[-1] == 1 and all(b <= a for a, b in itertools.pairwise(quiet))
