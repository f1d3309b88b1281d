"""The SLO scaler's decision as a table: every rule of docs/autoscaling.md ("SLO scaling"), a row each."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from flotilla_operator import autoscaler as a
from flotilla_operator import slo_scaler as s
from flotilla_operator.autoscaler import PoolMetrics, Recommendation, ScalingSpec
from flotilla_operator.slo_prometheus import LatencyReading
from flotilla_operator.slo_scaler import LatencySample, SloObservation, SloState, SloTargets
from flotilla_operator.slo_status import figures, latency_observation, state_from_status, state_patch

NOW = 1_800_000_000.0
SPEC = ScalingSpec(min_replicas=1, max_replicas=10, policy=a.COST_FIRST, target_queue_depth=16,
                   scale_down_stabilization_s=30)
TTFT = SloTargets(ttft_s=0.5, window_s=10)  # p90 TTFT <= 0.5 s, over 10 s
BOTH = SloTargets(ttft_s=0.5, tpot_s=0.05, window_s=10)
OLD = NOW - 100  # long enough ago that every window has passed


def load(running: float = 2, waiting: float = 0, slots: float = 2, reporting: int = 1) -> PoolMetrics:
    return PoolMetrics(waiting=waiting, running=running, slots_per_replica=slots, replicas_reporting=reporting)


def seen(ttft: float | None, tpot: float | None = None, requests: float = 20) -> LatencySample:
    return LatencySample(requests, ttft, tpot)


def history(*pairs: tuple[float, int], ready: int | None = None, grew: float | None = None,
            shed: float | None = None) -> SloState:
    """Recommendations as (seconds ago, replicas), the ready replicas last seen and when they grew."""
    return SloState(tuple(Recommendation(NOW - ago, n) for ago, n in pairs), ready, grew, shed)


@dataclass(frozen=True)
class Case:
    name: str
    latency: LatencySample | None
    pool: PoolMetrics | None
    current: int
    want: int
    reason: str
    ready: int | None = None  # default: current - starting
    starting: int = 0
    state: SloState = field(default_factory=SloState)
    slo: SloTargets = TTFT
    spec: ScalingSpec = SPEC


CASES = [
    # --- the signal and the dead band
    Case("on target holds in the band", seen(0.4), load(2, 0), 1, 1, s.REASON_WITHIN_BAND),
    Case("missed without a queue: up by the ratio, capped at 2 (ceil(1 x 2 / 0.9) = 3)", seen(5.0), load(2, 0), 1, 3,
         s.REASON_SCALE_UP),
    Case("missed a little: one more replica", seen(0.46), load(3, 0), 2, 3, s.REASON_SCALE_UP),
    Case("missed with a queue: the replicas whose slots, 80% full, hold all in flight (ceil(6 / 1.6))", seen(0.6),
         load(2, 4), 1, 4, s.REASON_SCALE_UP),
    Case("missed with a queue the slots already hold (uneven routing): one more", seen(0.6), load(5, 1, reporting=4),
         4, 5, s.REASON_SCALE_UP),
    Case("TPOT is the worse ratio", seen(0.1, 0.2), load(4, 0), 2, 5, s.REASON_SCALE_UP, slo=BOTH),
    Case("TTFT is the worse ratio", seen(0.9, 0.01), load(4, 0), 2, 4, s.REASON_SCALE_UP, slo=BOTH),
    Case("requests wait a whole window with no first token: TTFT >= window", seen(None, requests=0),
         load(2, 3), 1, 4, s.REASON_SCALE_UP),
    Case("no request at all reads 0: down to the floor after the window", seen(None, requests=0), load(0, 0), 3, 1,
         s.REASON_SCALE_DOWN, state=history((40, 3), ready=3)),
    # --- fast up: the step bound, the credit, fresh evidence, the ceiling
    Case("one step adds at most max(current, 4)", seen(9.0), load(10, 100, reporting=2), 2, 6,
         s.REASON_SCALE_UP_RATE_LIMITED),
    Case("the credit: replicas starting cover the need", seen(3.0), load(2, 6, reporting=1), 3, 3,
         s.REASON_PENDING_REPLICAS, ready=1, starting=2),
    Case("the credit: beyond the starting replicas, only the deficit is added", seen(3.0), load(4, 2, reporting=2),
         3, 5, s.REASON_SCALE_UP, ready=2, starting=1),
    Case("fresh evidence: replicas just became ready", seen(3.0), load(6, 4, reporting=3), 3, 3,
         s.REASON_STALE_WINDOW, ready=3, state=history((2, 3), ready=1)),
    Case("fresh evidence: one window after they became ready", seen(3.0), load(6, 4, reporting=3), 3, 7,
         s.REASON_SCALE_UP, ready=3, state=history((2, 3), ready=3, grew=NOW - 10)),
    Case("fresh evidence: the first replica ready leaves no older sample to wait out", seen(3.0), load(2, 3), 1, 4,
         s.REASON_SCALE_UP, state=history((2, 1), ready=0)),
    Case("at maxReplicas the miss holds", seen(3.0), load(20, 30, reporting=10), 10, 10, s.REASON_AT_MAX),
    # --- slow down: the band, the slots, the window, fresh evidence
    Case("below the band, but the slots are all needed", seen(0.05), load(4, 0, reporting=2), 2, 2,
         s.REASON_SLOTS_NEEDED, state=history((40, 2), ready=2)),
    Case("below the band: down to the replicas whose slots hold what runs", seen(0.05), load(3, 0, reporting=4), 4, 2,
         s.REASON_SCALE_DOWN, state=history((40, 4), ready=4)),
    Case("the scale-down window keeps a recent higher recommendation", seen(0.05), load(3, 0, reporting=4), 4, 4,
         s.REASON_SCALE_DOWN_STABILIZING, state=history((20, 4), ready=4)),
    Case("a first decision seeds the window with the current size", seen(0.05), load(0, 0, reporting=4), 4, 4,
         s.REASON_SCALE_DOWN_STABILIZING),
    Case("fresh evidence: not again within a window of the last scale-down", seen(0.05), load(1, 0, reporting=3), 3, 3,
         s.REASON_STALE_WINDOW, state=history((40, 1), ready=3, shed=NOW - 5)),
    Case("in the band no replica is shed", seen(0.3), load(1, 0, reporting=4), 4, 4, s.REASON_WITHIN_BAND,
         state=history((40, 1), ready=4)),
    # --- the outage hold and the bounds
    Case("latency not measured holds", None, load(2, 10), 2, 2, a.REASON_METRICS_UNAVAILABLE),
    Case("the queue query failed holds", seen(3.0), None, 2, 2, a.REASON_METRICS_UNAVAILABLE),
    Case("ready replicas that report nothing hold", seen(3.0), load(reporting=0), 2, 2, a.REASON_METRICS_UNAVAILABLE),
    Case("a spec edit below current clamps at once", seen(0.4), load(2, 0, reporting=12), 12, 10, a.REASON_OUT_OF_BOUNDS),
    Case("latency-first never recommends zero", seen(None, requests=0), load(0, 0), 2, 1, s.REASON_SCALE_DOWN,
         spec=replace(SPEC, policy=a.LATENCY_FIRST, min_replicas=0), state=history((40, 2), ready=2)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decision_table(case: Case) -> None:
    ready = case.current - case.starting if case.ready is None else case.ready
    obs = SloObservation(case.latency, case.pool, case.current, ready, case.starting, NOW)
    d = s.decide_slo(case.spec, case.slo, obs, case.state)
    assert (d.desired_replicas, d.reason) == (case.want, case.reason), d.message
    assert d.message.startswith("holding") or "R=" in d.message  # the numbers that drove it


def test_missing_data_remembers_nothing_and_says_why() -> None:
    state = history((5, 3), ready=2)
    obs = SloObservation(None, load(), 3, 3, 0, NOW, s.REASON_NOT_MEASURED, "no series has two samples")
    d = s.decide_slo(SPEC, TTFT, obs, state)
    assert (d.desired_replicas, d.reason, d.state) == (3, s.REASON_NOT_MEASURED, state)
    assert "no series has two samples" in d.message


def test_new_ready_replicas_start_the_fresh_window() -> None:
    obs = SloObservation(seen(0.4), load(2, 0, reporting=3), 3, 3, 0, NOW)
    d = s.decide_slo(SPEC, TTFT, obs, history((5, 3), ready=1, grew=OLD))
    assert d.state.ready_grew_at_s == NOW and d.state.ready_seen == 3
    d = s.decide_slo(SPEC, TTFT, obs, history((5, 3), ready=3, grew=OLD))
    assert d.state.ready_grew_at_s == OLD  # no growth: the old time stays


def test_a_scale_down_is_remembered() -> None:
    obs = SloObservation(seen(0.01), load(1, 0, reporting=4), 4, 4, 0, NOW)
    d = s.decide_slo(SPEC, TTFT, obs, history((40, 4), ready=4))
    assert d.desired_replicas == 1 and d.state.scaled_down_at_s == NOW


@pytest.mark.parametrize("queue_want, slo_want, want, winner", [
    (3, 5, 5, "slo"), (5, 3, 5, "queue"), (4, 4, 4, "queue"), (1, 3, 3, "slo"),
])
def test_the_larger_recommendation_wins(queue_want: int, slo_want: int, want: int, winner: str) -> None:
    queue = a.Decision(queue_want, "ScaleUp", "queue says")
    slo = s.SloDecision(slo_want, s.REASON_SCALE_UP, "slo says", signal=2.0)
    desired, reason, message = s.combine(queue, slo)
    assert desired == want
    assert reason == (s.REASON_SCALE_UP if winner == "slo" else "ScaleUp")
    assert message.startswith(f"{winner} says") and ("slo:" in message or "queue depth:" in message)


@pytest.mark.parametrize("kwargs, error", [
    ({}, "ttftSeconds, tpotSeconds or both"),
    ({"ttft_s": 0.0}, "above 0"),
    ({"tpot_s": -1.0}, "above 0"),
    ({"ttft_s": 1.0, "ttft_percentile": 1.0}, "strictly between 0 and 1"),
    ({"ttft_s": 1.0, "tpot_percentile": 0.0}, "strictly between 0 and 1"),
    ({"ttft_s": 1.0, "window_s": 0.0}, "windowSeconds"),
])
def test_targets_refuse_bad_values(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SloTargets(**kwargs)


def test_state_round_trips_through_status() -> None:
    state = history((10, 3), (5, 2), ready=2, grew=NOW - 30, shed=NOW - 8)
    back = state_from_status({"slo": state_patch(state)})
    assert back.recommendations == state.recommendations and back.ready_seen == 2
    assert back.ready_grew_at_s == pytest.approx(NOW - 30) and back.scaled_down_at_s == pytest.approx(NOW - 8)
    assert state_from_status({"slo": {"recommendations": [{"time": "garbage"}], "readyGrewAt": 7}}) == SloState()


def test_what_the_scaler_sees_of_a_reading() -> None:
    assert latency_observation(None, 10, 1)[:2] == (None, a.REASON_METRICS_UNAVAILABLE)
    missing, reason, why = latency_observation(LatencyReading(None), 10, 2)
    assert missing is None and reason == s.REASON_NOT_MEASURED and "slo.windowSeconds" in why
    assert latency_observation(LatencyReading(None), 10, 0)[0] == LatencySample(0.0)  # at zero: nothing served
    assert latency_observation(LatencyReading(4.0, 0.3), 10, 1)[0] == LatencySample(4.0, 0.3, None)


def test_status_figures_show_percentiles_and_attainment() -> None:
    buckets = ((0.25, 2.0), (0.5, 6.0), (1.0, 8.0), (float("inf"), 10.0))
    reading = LatencyReading(10.0, 0.8, None, ttft_buckets=buckets)
    decision = s.SloDecision(2, s.REASON_SCALE_UP, "", signal=1.6)
    out = figures(TTFT, reading, decision, NOW)
    assert out["ttftSeconds"] == 0.8 and out["ttftAttainment"] == 0.6 and out["signal"] == 1.6
    assert out["requests"] == 10.0 and out["windowSeconds"] == 10 and "tpotSeconds" not in out
