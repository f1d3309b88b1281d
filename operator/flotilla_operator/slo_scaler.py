"""The SLO scaler's decision: a pure function from measured latency percentiles to replicas.

Queue depth says how much work waits; it does not say whether users get what they were promised. This
rule scales on the promise itself (`spec.slo`: a TTFT and a TPOT target, each at a percentile), beside
the queue-depth rule of autoscaler.py, and the larger recommendation of the two wins (`combine`). Like
`autoscaler.decide` it has no clock, no API and no Prometheus, so each rule is a row of a table test
(tests/operator/test_slo_scaler.py); the loop in handlers/autoscale.py gathers the inputs.

    signal   s = max(TTFT_p / ttftSeconds, TPOT_p / tpotSeconds)   over the set targets, measured over
               windowSeconds; no first token in the window reads 0, unless requests wait: then TTFT >= window
    slots    N = ceil((R+Q) / (SLOT_FILL x S))  the replicas that hold every request in flight in a slot
    up       s > SCALE_UP_ABOVE:    with a queue (and no replica starting), max(N, current + 1): a slot shortage;
                                    else ceil(ready x min(s, SIGNAL_CAP) / SCALE_UP_ABOVE), against every
                                    replica asked for (the credit for those still starting)
    hold     SCALE_DOWN_BELOW <= s <= SCALE_UP_ABOVE (the dead band)
    down     s < SCALE_DOWN_BELOW:  N, after the scale-down window, and never fewer

Documented with every constant in docs/autoscaling.md ("SLO scaling").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flotilla_operator.autoscaler import (
    REASON_METRICS_UNAVAILABLE,
    REASON_OUT_OF_BOUNDS,
    Decision,
    PoolMetrics,
    Recommendation,
    ScalingSpec,
    floor_replicas,
    scale_up_limit,
)

SIGNAL_CAP = 2.0  # past 2x the target, "add at the maximum rate" says all; at the queueing knee the raw ratio jumps 10-90x
SCALE_UP_ABOVE = 0.9  # the dead band's top: scale up before the target is missed, at 90% of it
SCALE_DOWN_BELOW = 0.5  # the dead band's bottom: shed replicas only with half the target to spare
# Slots are counted this full: a fifth kept free gives a rise room to show in the latency before it queues.
# At 1.0 every rise queued at once and its late catch-up cost more (docs/autoscaling.md, "SLO scaling").
SLOT_FILL = 0.8
MAX_HISTORY = 200  # recommendations kept in status, oldest dropped first

REASON_SCALE_UP = "SloScaleUp"
REASON_SCALE_UP_RATE_LIMITED = "SloScaleUpRateLimited"
REASON_PENDING_REPLICAS = "SloPendingReplicas"  # the need is covered by replicas still starting (the credit)
REASON_STALE_WINDOW = "SloWaitingForFreshWindow"  # the window still holds samples from before the last change
REASON_AT_MAX = "SloAtMaxReplicas"
REASON_WITHIN_BAND = "SloWithinBand"
REASON_SCALE_DOWN = "SloScaleDown"
REASON_SCALE_DOWN_STABILIZING = "SloScaleDownStabilizing"
REASON_SLOTS_NEEDED = "SloSlotsNeeded"  # below the band, but every replica's slots are needed
REASON_NOT_MEASURED = "SloNotMeasured"  # Prometheus answered, but no latency series has two samples in the window
HOLDS = (REASON_METRICS_UNAVAILABLE, REASON_NOT_MEASURED)  # the outage hold: nothing measured, nothing changes


@dataclass(frozen=True)
class SloTargets:
    """spec.slo: the targets, each at its percentile, and the window they are measured over."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    ttft_percentile: float = 0.9
    tpot_percentile: float = 0.9
    window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.ttft_s is None and self.tpot_s is None:
            raise ValueError("slo must set ttftSeconds, tpotSeconds or both")
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"slo.{name[:4]}Seconds must be above 0, got {value}")
        for name in ("ttft_percentile", "tpot_percentile"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"slo.{name[:4]}Percentile must be strictly between 0 and 1, got {getattr(self, name)}")
        if not self.window_s > 0:
            raise ValueError(f"slo.windowSeconds must be above 0, got {self.window_s}")


@dataclass(frozen=True)
class LatencySample:
    """Pool-wide latency over the window, as Prometheus measured it from the servers' histograms."""

    requests: float  # first tokens in the window
    ttft_s: float | None = None  # TTFT at the target's percentile; None: no first token in the window
    tpot_s: float | None = None  # inter-token gap at the target's percentile; None: no token in the window


@dataclass(frozen=True)
class SloObservation:
    latency: LatencySample | None  # None: not measured (missing_reason says why)
    load: PoolMetrics | None  # the queue-depth rule's sums (R, Q, S); None: that query failed
    current_replicas: int
    ready_replicas: int
    starting_replicas: int
    now_s: float
    missing_reason: str = REASON_METRICS_UNAVAILABLE  # why `latency` is None: the query failed, or ...
    missing_why: str = "the Prometheus query failed"  # ... no series to rate (REASON_NOT_MEASURED)


@dataclass(frozen=True)
class SloState:
    """What the SLO scaler remembers between decisions; persisted in status.autoscaler.slo."""

    recommendations: tuple[Recommendation, ...] = ()
    ready_seen: int | None = None  # ready replicas at the last decision
    ready_grew_at_s: float | None = None  # when ready replicas last grew: the window must postdate it
    scaled_down_at_s: float | None = None  # when this rule last shed replicas: likewise, before shedding more


@dataclass(frozen=True)
class SloDecision:
    desired_replicas: int
    reason: str
    message: str
    state: SloState = field(default_factory=SloState)
    recommendation: int | None = None  # None when metrics were missing
    signal: float | None = None  # s, before the cap


def signal(slo: SloTargets, latency: LatencySample, waiting: float) -> tuple[float, str]:
    """s and the figures behind it. A request waiting through a whole window without its first token has a
    TTFT of at least the window, so an empty window with a queue reads window / target, not 0."""
    ratios, parts = [], []
    if slo.ttft_s is not None:
        if latency.ttft_s is not None:
            ratio, seen = latency.ttft_s / slo.ttft_s, f"{latency.ttft_s:.3g}s"
        elif waiting > 0:
            ratio, seen = slo.window_s / slo.ttft_s, f">={slo.window_s:g}s (none in the window, {waiting:g} waiting)"
        else:
            ratio, seen = 0.0, "none"
        ratios.append(ratio)
        parts.append(f"ttft p{_pct(slo.ttft_percentile)}={seen}/{slo.ttft_s:g}s")
    if slo.tpot_s is not None:
        ratio = latency.tpot_s / slo.tpot_s if latency.tpot_s is not None else 0.0
        ratios.append(ratio)
        seen = f"{latency.tpot_s:.3g}s" if latency.tpot_s is not None else "none"
        parts.append(f"tpot p{_pct(slo.tpot_percentile)}={seen}/{slo.tpot_s:g}s")
    s = max(ratios)
    return s, f"s={s:.3g} ({' '.join(parts)}, {latency.requests:g} requests in {slo.window_s:g}s)"


def _pct(percentile: float) -> str:
    return f"{percentile * 100:g}"


def _clamp(value: int, spec: ScalingSpec) -> int:
    return min(max(value, floor_replicas(spec)), spec.max_replicas)


def _fresh(since_s: float | None, now_s: float, window_s: float) -> bool:
    return since_s is None or now_s - since_s >= window_s


def decide_slo(spec: ScalingSpec, slo: SloTargets, obs: SloObservation, state: SloState) -> SloDecision:
    """Desired replicas by the SLO alone, with the reason, the numbers, and the state to remember.

    `spec` supplies the bounds and the scale-down window the model's queue-depth rule uses too."""
    current = obs.current_replicas
    load, latency = obs.load, obs.latency
    if latency is None:  # the outage hold: never scale on what was not measured
        return SloDecision(current, obs.missing_reason, f"holding {current} replicas: slo: {obs.missing_why}", state)
    if load is None or (obs.ready_replicas > 0 and load.replicas_reporting == 0):
        why = "the Prometheus query failed" if load is None else f"no replica reports metrics while {obs.ready_replicas} are ready"
        return SloDecision(current, REASON_METRICS_UNAVAILABLE, f"holding {current} replicas: {why}", state)

    s, figures = signal(slo, latency, load.waiting)
    in_flight = load.running + load.waiting
    slots_need = math.ceil(in_flight / max(SLOT_FILL * load.slots_per_replica, 1e-9) - 1e-9) if in_flight > 0 else 0
    grew_at = state.ready_grew_at_s
    if state.ready_seen and obs.ready_replicas > state.ready_seen:
        # new capacity: the window holds samples from before it until one window has passed (from none ready,
        # it holds none: nothing was served before)
        grew_at = obs.now_s
    numbers = (f"{figures}; R={load.running:g} Q={load.waiting:g} S={load.slots_per_replica:g} "
               f"N=ceil((R+Q)/({SLOT_FILL:g}S))={slots_need} current={current} ready={obs.ready_replicas} "
               f"starting={obs.starting_replicas}")

    if s > SCALE_UP_ABOVE:
        if load.waiting > 0 and obs.starting_replicas == 0:
            # a miss with a queue is a shortage of slots: as many replicas as hold every request in flight
            need = max(slots_need, current + 1)
        else:
            # a miss without one (or while replicas boot, whose queue is what they come to serve) scales with the
            # miss, measured on the ready replicas and compared with every replica asked for: the credit
            need = math.ceil(max(obs.ready_replicas, 1) * min(s, SIGNAL_CAP) / SCALE_UP_ABOVE - 1e-9)
        recommendation = _clamp(need, spec)
    elif s < SCALE_DOWN_BELOW:
        recommendation = _clamp(slots_need, spec)
    else:
        recommendation = _clamp(current, spec)

    seed = () if state.recommendations else (Recommendation(obs.now_s, current),)
    history = tuple(r for r in (*state.recommendations, *seed, Recommendation(obs.now_s, recommendation))
                    if obs.now_s - spec.scale_down_stabilization_s <= r.time_s <= obs.now_s)[-MAX_HISTORY:]

    def done(desired: int, reason: str, note: str) -> SloDecision:
        shed = desired < current
        new_state = SloState(history, obs.ready_replicas, grew_at, obs.now_s if shed else state.scaled_down_at_s)
        return SloDecision(desired, reason, f"{note}; {numbers}", new_state, recommendation, s)

    if not floor_replicas(spec) <= current <= spec.max_replicas:
        bounded = _clamp(current, spec)
        return done(bounded, REASON_OUT_OF_BOUNDS, f"{current} is outside [{floor_replicas(spec)}, {spec.max_replicas}]")

    if s > SCALE_UP_ABOVE:
        if recommendation <= current:
            if current >= spec.max_replicas:
                return done(current, REASON_AT_MAX, f"recommend more, held at maxReplicas {spec.max_replicas}")
            return done(current, REASON_PENDING_REPLICAS, f"recommend {recommendation}, covered by the {current} "
                        f"asked for ({obs.starting_replicas} still starting)")
        if not _fresh(grew_at, obs.now_s, slo.window_s):
            return done(current, REASON_STALE_WINDOW, f"recommend {recommendation}, waiting until the "
                        f"{slo.window_s:g}s window holds only samples since replicas last became ready")
        limit = scale_up_limit(current)
        if recommendation > limit:
            return done(limit, REASON_SCALE_UP_RATE_LIMITED, f"scale up to {limit} (recommend {recommendation}, "
                        f"one step adds at most max({current}, 4))")
        return done(recommendation, REASON_SCALE_UP, f"scale up to {recommendation}")

    if recommendation < current:
        down_to = max(r.replicas for r in history)
        if down_to >= current:
            return done(current, REASON_SCALE_DOWN_STABILIZING, f"recommend {recommendation}, highest in the "
                        f"{spec.scale_down_stabilization_s:g}s scale-down window is {down_to}")
        if not (_fresh(grew_at, obs.now_s, slo.window_s) and _fresh(state.scaled_down_at_s, obs.now_s, slo.window_s)):
            return done(current, REASON_STALE_WINDOW, f"recommend {recommendation}, waiting until the "
                        f"{slo.window_s:g}s window holds only samples since the last change of replicas")
        return done(down_to, REASON_SCALE_DOWN, f"scale down to {down_to}")

    if s < SCALE_DOWN_BELOW:
        return done(current, REASON_SLOTS_NEEDED, f"hold {current}: fewer replicas could not hold every request "
                    "in flight in a slot")
    return done(current, REASON_WITHIN_BAND, f"hold {current}: within the band "
                f"[{SCALE_DOWN_BELOW:g}, {SCALE_UP_ABOVE:g}] of the target")


def combine(queue: Decision, slo: SloDecision) -> tuple[int, str, str]:
    """Both rules' answer: the larger desired replicas win (ties go to the queue-depth rule, the older one).
    Returns (desired replicas, reason, message); the message names the other rule's answer too."""
    if slo.desired_replicas > queue.desired_replicas:
        return (slo.desired_replicas, slo.reason,
                f"{slo.message}; queue depth: {queue.reason} {queue.desired_replicas}")
    return (queue.desired_replicas, queue.reason,
            f"{queue.message}; slo: {slo.reason} {slo.desired_replicas}, {_short(slo)}")


def _short(slo: SloDecision) -> str:
    """The SLO side's signal, for the message of a decision the queue-depth rule won."""
    return f"s={slo.signal:.3g}" if slo.signal is not None else "no latency measured"
