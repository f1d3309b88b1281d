"""The autoscaler's decision: a pure function from queue-depth metrics and remembered history to replicas.

It exists apart from the kopf loop so that every rule (tolerance, clamps, rate limit, stabilization,
pending guard, missing metrics, scale to zero) is tested as a table, with no clock, no API and no
Prometheus. The loop in `handlers/autoscale.py` gathers the inputs and carries out the result.

Formula (documented in docs/autoscaling.md):

    weighted  R = R − (1−w)·R_batch    requests marked `batch` count w = scaling.batchDemandWeight (default 0),
              Q = Q − (1−w)·Q_batch    interactive ones 1; no class series (an older server): R_batch = Q_batch = 0
    demand    D = R + Q + P            running + waiting (pool-wide) + demand held at zero by a front door
    target    T = 0.75·S               latency-first: headroom, no queueing
              T = S + targetQueueDepth cost-first: every slot busy plus an allowed queue
    raw         = ceil(D / T)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

LATENCY_FIRST = "latency-first"
COST_FIRST = "cost-first"
POLICIES = (LATENCY_FIRST, COST_FIRST)

LATENCY_FIRST_HEADROOM = 0.75  # latency-first fills a replica to 75% of its slots
TOLERANCE = 0.10  # demand within 10% of the current capacity's target holds (as the HPA)
SCALE_UP_MIN_STEP = 4  # one step adds at most max(current, 4) replicas (HPA default: 100% or 4 pods)
MAX_HISTORY = 200  # recommendations kept in status, oldest dropped first

# Reasons are a small closed set: they label a Prometheus counter and an Event.
REASON_SCALE_UP = "ScaleUp"
REASON_SCALE_UP_RATE_LIMITED = "ScaleUpRateLimited"
REASON_SCALE_DOWN = "ScaleDown"
REASON_SCALE_TO_ZERO = "ScaleToZero"
REASON_WITHIN_TOLERANCE = "WithinTolerance"
REASON_STABLE = "Stable"
REASON_SCALE_UP_STABILIZING = "ScaleUpStabilizing"
REASON_SCALE_DOWN_STABILIZING = "ScaleDownStabilizing"
REASON_PENDING_REPLICAS = "PendingReplicas"
REASON_IDLE_WINDOW = "WaitingForIdleWindow"
REASON_METRICS_UNAVAILABLE = "MetricsUnavailable"
REASON_OUT_OF_BOUNDS = "OutOfBounds"


@dataclass(frozen=True)
class ScalingSpec:
    min_replicas: int
    max_replicas: int
    policy: str = COST_FIRST
    target_queue_depth: float = 8.0  # cost-first: queued requests allowed per replica (the CRD default)
    scale_up_stabilization_s: float = 0.0  # scale up to the lowest recommendation of this window
    scale_down_stabilization_s: float = 300.0  # scale down to the highest recommendation of this window
    scale_to_zero_after_s: float = 600.0  # cost-first with min 0: no demand for this long before zero
    batch_demand_weight: float = 0.0  # w: what one batch request counts toward demand (interactive: 1)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"placement.policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"scaling needs 0 <= minReplicas <= maxReplicas, got {self.min_replicas} and {self.max_replicas}"
            )
        if self.target_queue_depth < 0:
            raise ValueError(f"scaling.targetQueueDepth must be >= 0, got {self.target_queue_depth}")
        for name in ("scale_up_stabilization_s", "scale_down_stabilization_s", "scale_to_zero_after_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"scaling.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.batch_demand_weight <= 1:
            raise ValueError(f"scaling.batchDemandWeight must be between 0 and 1, got {self.batch_demand_weight}")


@dataclass(frozen=True)
class PoolMetrics:
    """Pool-wide sums for one model, as Prometheus reports them."""

    waiting: float  # Q: requests queued in all replicas
    running: float  # R: requests holding a slot in all replicas
    slots_per_replica: float  # S: max_num_seqs of one replica
    replicas_reporting: int  # replicas whose metrics Prometheus holds
    waiting_batch: float = 0.0  # Q_batch: of `waiting`, requests of class batch (0 when no server reports classes)
    running_batch: float = 0.0  # R_batch: of `running`, requests of class batch


@dataclass(frozen=True)
class Recommendation:
    time_s: float  # wall-clock seconds since the epoch, so that history survives a restart
    replicas: int


@dataclass(frozen=True)
class AutoscalerState:
    """What the autoscaler remembers between decisions; persisted in status.autoscaler."""

    recommendations: tuple[Recommendation, ...] = ()
    idle_since_s: float | None = None  # when demand was last seen to drop to zero; None while demand exists


@dataclass(frozen=True)
class Observation:
    metrics: PoolMetrics | None  # None: the query failed
    current_replicas: int  # .spec.replicas now
    ready_replicas: int
    starting_replicas: int  # created but not ready: capacity to come
    now_s: float
    pending_demand: int = 0  # requests a front door holds for a model at zero
    woken_at_s: float | None = None  # when a gateway last woke the model from zero (flotilla.dev/woken-at)


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    reason: str
    message: str  # the numbers that drove the decision, for status and the Event
    state: AutoscalerState = field(default_factory=AutoscalerState)
    recommendation: int | None = None  # this tick's recommendation; None when metrics were missing

    def direction(self, current_replicas: int) -> str:
        if self.desired_replicas > current_replicas:
            return "up"
        if self.desired_replicas < current_replicas:
            return "down"
        return "hold"


def weighted_demand(spec: ScalingSpec, metrics: PoolMetrics) -> tuple[float, float]:
    """(R, Q) with each batch request counted `batchDemandWeight` instead of 1; never below zero (the class
    gauges and the totals are separate series, so one scrape may see them a request apart)."""
    discount = 1.0 - spec.batch_demand_weight
    running = max(metrics.running - discount * metrics.running_batch, 0.0)
    waiting = max(metrics.waiting - discount * metrics.waiting_batch, 0.0)
    return running, waiting


def target_in_flight(spec: ScalingSpec, slots_per_replica: float) -> float:
    """Requests one replica should carry under the policy."""
    if spec.policy == LATENCY_FIRST:
        return max(LATENCY_FIRST_HEADROOM * slots_per_replica, 1e-9)
    return max(slots_per_replica + spec.target_queue_depth, 1e-9)


def scale_up_limit(current_replicas: int) -> int:
    """The most replicas one step may reach from `current_replicas`."""
    return current_replicas + max(current_replicas, SCALE_UP_MIN_STEP)


def floor_replicas(spec: ScalingSpec) -> int:
    """Latency-first never goes below one replica, whatever minReplicas says."""
    return max(spec.min_replicas, 1) if spec.policy == LATENCY_FIRST else spec.min_replicas


def _clamp(value: int, spec: ScalingSpec) -> int:
    return min(max(value, floor_replicas(spec)), spec.max_replicas)


def _trim(history: tuple[Recommendation, ...], spec: ScalingSpec, now_s: float) -> tuple[Recommendation, ...]:
    keep_s = max(spec.scale_up_stabilization_s, spec.scale_down_stabilization_s)
    kept = tuple(r for r in history if now_s - keep_s <= r.time_s <= now_s)
    return kept[-MAX_HISTORY:]


def _window(history: tuple[Recommendation, ...], window_s: float, now_s: float) -> list[int]:
    return [r.replicas for r in history if now_s - window_s <= r.time_s <= now_s]


def decide(spec: ScalingSpec, obs: Observation, state: AutoscalerState) -> Decision:
    """Desired replicas for one model, with the reason and the numbers, and the state to remember."""
    current = obs.current_replicas
    metrics = obs.metrics
    if metrics is None or (obs.ready_replicas > 0 and metrics.replicas_reporting == 0):
        why = "the Prometheus query failed" if metrics is None else (
            f"no replica reports metrics while {obs.ready_replicas} are ready"
        )
        # Missing data holds: never scale (and never to zero) on what was not measured.
        return Decision(current, REASON_METRICS_UNAVAILABLE, f"holding {current} replicas: {why}", state)

    running, waiting = weighted_demand(spec, metrics)
    demand = running + waiting + obs.pending_demand
    # Any request at all, batch included, is work in the system: it keeps one replica (batch work must
    # finish, not scale the model to zero) and stops the idle clock, whatever its weight in the demand.
    busy = metrics.running + metrics.waiting + obs.pending_demand > 0
    target = target_in_flight(spec, metrics.slots_per_replica)
    raw = math.ceil(demand / target - 1e-9) if demand > 0 else (1 if busy else 0)
    batch = ""
    if metrics.running_batch > 0 or metrics.waiting_batch > 0:
        batch = (f" (batch Rb={metrics.running_batch:g} Qb={metrics.waiting_batch:g} "
                 f"weighed w={spec.batch_demand_weight:g})")
    numbers = (
        f"R={running:g} Q={waiting:g}{batch} P={obs.pending_demand} S={metrics.slots_per_replica:g} "
        f"T={target:g} ceil((R+Q+P)/T)={raw} current={current} ready={obs.ready_replicas} "
        f"starting={obs.starting_replicas}"
    )
    within_tolerance = current > 0 and abs(demand / (current * target) - 1.0) <= TOLERANCE
    recommendation = _clamp(current if within_tolerance else raw, spec)

    idle_since = state.idle_since_s if not busy else None
    if not busy and idle_since is None:
        idle_since = obs.now_s
    # A model seen for the first time (or after its whole history expired) remembers its current
    # size as a recommendation, so nothing shrinks before one full window of evidence (as the HPA).
    seed = () if state.recommendations else (Recommendation(obs.now_s, current),)
    history = _trim((*state.recommendations, *seed, Recommendation(obs.now_s, recommendation)), spec, obs.now_s)
    new_state = AutoscalerState(history, idle_since)

    def done(desired: int, reason: str, note: str) -> Decision:
        return Decision(desired, reason, f"{note}; {numbers}", new_state, recommendation)

    if not floor_replicas(spec) <= current <= spec.max_replicas:
        # A spec edit moved the bounds: obey them at once, no window applies.
        bounded = _clamp(current, spec)
        return done(bounded, REASON_OUT_OF_BOUNDS, f"{current} is outside [{floor_replicas(spec)}, {spec.max_replicas}]")

    if recommendation > current:
        if obs.starting_replicas > 0:
            # Pending guard: the queue seen while replicas load is what they are coming to serve;
            # adding more before they are ready is the overshoot cascade (AIBrix #2670).
            return done(current, REASON_PENDING_REPLICAS, f"recommend {recommendation}, waiting for "
                        f"{obs.starting_replicas} starting replicas before adding more")
        up_window = _window(history, spec.scale_up_stabilization_s, obs.now_s)
        up_to = min(up_window) if spec.scale_up_stabilization_s > 0 else recommendation
        if up_to <= current:
            return done(current, REASON_SCALE_UP_STABILIZING, f"recommend {recommendation}, lowest in the "
                        f"{spec.scale_up_stabilization_s:g}s scale-up window is {up_to}")
        limit = scale_up_limit(current)
        if up_to > limit:
            return done(limit, REASON_SCALE_UP_RATE_LIMITED, f"scale up to {limit} (recommend {up_to}, "
                        f"one step adds at most max({current}, {SCALE_UP_MIN_STEP}))")
        return done(up_to, REASON_SCALE_UP, f"scale up to {up_to}")

    if recommendation < current:
        down_to = max(_window(history, spec.scale_down_stabilization_s, obs.now_s))
        if down_to >= current:
            return done(current, REASON_SCALE_DOWN_STABILIZING, f"recommend {recommendation}, highest in the "
                        f"{spec.scale_down_stabilization_s:g}s scale-down window is {down_to}")
        if down_to == 0:
            idle_s = obs.now_s - idle_since if idle_since is not None else 0.0
            if obs.woken_at_s is not None:
                # a fresh wake counts as demand: its held requests may not be in Prometheus yet
                idle_s = min(idle_s, max(0.0, obs.now_s - obs.woken_at_s))
            if idle_s < spec.scale_to_zero_after_s:
                if current == 1:
                    return done(1, REASON_IDLE_WINDOW, f"no demand for {idle_s:g}s of the "
                                f"{spec.scale_to_zero_after_s:g}s needed to scale to zero")
                return done(1, REASON_SCALE_DOWN, f"scale down to 1 (zero after {spec.scale_to_zero_after_s:g}s idle)")
            return done(0, REASON_SCALE_TO_ZERO, f"scale to zero after {idle_s:g}s with no demand")
        return done(down_to, REASON_SCALE_DOWN, f"scale down to {down_to}")

    reason = REASON_WITHIN_TOLERANCE if within_tolerance and raw != current else REASON_STABLE
    return done(current, reason, f"hold {current}")

