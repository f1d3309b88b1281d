"""The adaptive tier decision: whether a model of `placement.policy: adaptive` is served from its shared pool
(cost-first: a member of a ModelPool, loaded on demand) or from dedicated replicas (latency-first: its own
Deployment), from its traffic, its SLO and how the pool treats it.

Why a decision of its own: real traffic does not hold still (a model is hot at launch and cold a month later,
hot by day and idle at night), so a tier picked once is wrong for most of a model's life; and a move costs a
cold load on the other side, so a rule that follows every swing of demand pays that cost over and over. It is
a pure function so that every rule is a row of a table test, and so that the simulator runs this very
function (sim/flotilla_sim/policies.py) over a day of traffic. The operator carries the move out
(make-before-break, docs/autoscaling.md, "Adaptive tiering").

Signals, each over the last `window_s` of samples:
- demand, in replicas' worth of slots ((running + waiting) / slots per replica): "sustained" high means its
  lower quartile is at or above `promote_demand_replicas`, sustained low that its upper quartile is at or under
  `demote_demand_replicas` (less: the gap between the two is the hysteresis);
- SLO attainment in the current tier (the fraction of requests within target; None without an SLO or traffic);
- cold loads per hour in the pool (a model the pool keeps evicting pays a load on every return).

Rules, in order (the first that applies decides):
1. a pool that cannot hold the model at all sends it to dedicated replicas at once (no bound applies: it
   cannot be served there);
2. under `window_s` of history, or no sample within the window (metrics stopped): hold (GatheringHistory,
   NoRecentSamples);
3. in the pool: promote on sustained demand; or, while the model's median demand is over
   `demote_demand_replicas`, on attainment under `promote_attainment` or on cold loads per hour at or above
   `promote_cold_loads_per_h` (a trickle of requests that missed, or a model the pool evicts between rare
   requests, is what the pool is for: dedicated, it would be demoted at once, so every promotion leaves the
   model with demand that keeps it dedicated);
   dedicated: demote on sustained low demand when its attainment is at least `demote_attainment` (a model
   that misses its SLO on its own replicas would miss it worse in the pool) and the pool has room for it
   (its members' demand plus the model's stays within `pool_fill_limit` of the pool's replicas);
4. a move within `min_stay_s` of the last one, or past `max_moves_per_h` moves fleet-wide in the last hour,
   is held (MinimumStay, MoveBudgetSpent): the reason says which move waits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

POOL = "pool"
DEDICATED = "dedicated"
TIERS = (POOL, DEDICATED)

# Reasons are a small closed set: they label an Event, a Prometheus counter and status.
REASON_SUSTAINED_DEMAND = "SustainedDemand"
REASON_SLO_MISSED_IN_POOL = "SloMissedInPool"
REASON_COLD_LOADS = "ColdLoads"
REASON_DEMAND_LOW = "DemandLow"
REASON_POOL_CANNOT_HOLD = "PoolCannotHold"
REASON_GATHERING_HISTORY = "GatheringHistory"
REASON_NO_RECENT_SAMPLES = "NoRecentSamples"
REASON_MINIMUM_STAY = "MinimumStay"
REASON_MOVE_BUDGET_SPENT = "MoveBudgetSpent"
REASON_POOL_FULL = "PoolFull"
REASON_SLO_MISSED_DEDICATED = "SloMissedDedicated"
REASON_STAYS = "Stays"

HOUR_S = 3600.0


@dataclass(frozen=True)
class TieringSpec:
    promote_demand_replicas: float = 0.5  # sustained demand that pays for a replica of its own
    demote_demand_replicas: float = 0.2  # sustained demand under which the pool's share is cheaper
    promote_attainment: float = 0.90  # SLO attainment in the pool under which the model is promoted
    demote_attainment: float = 0.95  # SLO attainment on its own replicas needed before it goes back
    promote_cold_loads_per_h: float = 6.0  # cold loads per hour in the pool that earn a promotion
    pool_fill_limit: float = 0.8  # a demotion keeps the pool's demand within this share of its replicas
    window_s: float = 600.0  # the signals are read over this much history
    min_stay_s: float = 1800.0  # a model stays in a tier at least this long
    max_moves_per_h: int = 20  # moves fleet-wide in any hour

    def __post_init__(self) -> None:
        if not 0 <= self.demote_demand_replicas < self.promote_demand_replicas:
            raise ValueError("tiering needs 0 <= demoteDemandReplicas < promoteDemandReplicas, got "
                             f"{self.demote_demand_replicas} and {self.promote_demand_replicas}")
        if not 0 < self.promote_attainment <= self.demote_attainment <= 1:
            raise ValueError("tiering needs 0 < promoteAttainment <= demoteAttainment <= 1, got "
                             f"{self.promote_attainment} and {self.demote_attainment}")
        if not 0 < self.pool_fill_limit <= 1:
            raise ValueError(f"tiering.poolFillLimit must be in (0, 1], got {self.pool_fill_limit}")
        for name in ("promote_cold_loads_per_h", "window_s", "min_stay_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"tiering.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_moves_per_h < 1:
            raise ValueError(f"tiering.max_moves_per_h must be >= 1, got {self.max_moves_per_h}")


@dataclass(frozen=True)
class TierSample:
    """One observation of the model, in whichever tier it was then."""

    at_s: float
    demand_replicas: float  # (running + waiting) / slots per replica
    attainment: float | None = None  # SLO attainment since the previous sample; None: no SLO or no requests
    cold_loads: int = 0  # the pool's loads of the model since the previous sample


@dataclass(frozen=True)
class PoolView:
    """The shared pool the model belongs to, as the operator sees it now."""

    replicas: float  # pool servers ready
    demand_replicas: float  # its members' demand, the model's own excluded
    can_hold: bool = True  # a pool server's memory budget can hold the model (with its KV pool)


@dataclass(frozen=True)
class ModelTier:
    tier: str  # POOL or DEDICATED: where it is served now (a move in flight counts as its source)
    since_s: float  # when it entered that tier (status); -inf: never moved
    spec: TieringSpec = TieringSpec()

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {self.tier!r}")


@dataclass(frozen=True)
class TierHistory:
    samples: tuple[TierSample, ...]  # the model's, oldest first
    fleet_moves_s: tuple[float, ...] = ()  # when each move of any adaptive model in the fleet started


@dataclass(frozen=True)
class TierDecision:
    tier: str  # where the model should be served
    reason: str
    demand_replicas: float = math.nan  # the quartile the rule read (lower in the pool, upper dedicated)
    attainment: float | None = None
    cold_loads_per_h: float = 0.0

    def moves_from(self, current: str) -> bool:
        return self.tier != current


def _quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default), in pure Python."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _window(history: TierHistory, spec: TieringSpec, now_s: float) -> list[TierSample]:
    return [s for s in history.samples if now_s - spec.window_s <= s.at_s <= now_s]


def _covers_window(history: TierHistory, spec: TieringSpec, now_s: float) -> bool:
    return bool(history.samples) and history.samples[0].at_s <= now_s - spec.window_s


def _attainment(window: Sequence[TierSample]) -> float | None:
    known = [s.attainment for s in window if s.attainment is not None]
    return sum(known) / len(known) if known else None


def _bounded(model: ModelTier, history: TierHistory, target: str, reason: str, now_s: float,
             signals: dict) -> TierDecision:
    """A move to `target` for `reason`, unless the minimum stay or the fleet's move budget holds it."""
    spec = model.spec
    if now_s - model.since_s < spec.min_stay_s:
        return TierDecision(model.tier, f"{REASON_MINIMUM_STAY}:{reason}", **signals)
    recent = sum(1 for at_s in history.fleet_moves_s if now_s - HOUR_S < at_s <= now_s)
    if recent >= spec.max_moves_per_h:
        return TierDecision(model.tier, f"{REASON_MOVE_BUDGET_SPENT}:{reason}", **signals)
    return TierDecision(target, reason, **signals)


def decide_tier(history: TierHistory, pool: PoolView, model: ModelTier, now_s: float) -> TierDecision:
    """Where the model should be served now, and why (the module's docstring lists the rules)."""
    spec = model.spec
    if not pool.can_hold:
        return TierDecision(DEDICATED, REASON_POOL_CANNOT_HOLD if model.tier == POOL else REASON_STAYS)
    if not _covers_window(history, spec, now_s):
        return TierDecision(model.tier, REASON_GATHERING_HISTORY)
    window = _window(history, spec, now_s)
    if not window:  # metrics stopped: hold, as the autoscalers do through an outage
        return TierDecision(model.tier, REASON_NO_RECENT_SAMPLES)
    demand = [s.demand_replicas for s in window]
    attainment = _attainment(window)
    loads_per_h = sum(s.cold_loads for s in window) * HOUR_S / spec.window_s if spec.window_s else 0.0
    if model.tier == POOL:
        low = _quantile(demand, 0.25)
        signals = {"demand_replicas": low, "attainment": attainment, "cold_loads_per_h": loads_per_h}
        if low >= spec.promote_demand_replicas:
            return _bounded(model, history, DEDICATED, REASON_SUSTAINED_DEMAND, now_s, signals)
        if _quantile(demand, 0.5) > spec.demote_demand_replicas:
            if attainment is not None and attainment < spec.promote_attainment:
                return _bounded(model, history, DEDICATED, REASON_SLO_MISSED_IN_POOL, now_s, signals)
            if spec.promote_cold_loads_per_h and loads_per_h >= spec.promote_cold_loads_per_h:
                return _bounded(model, history, DEDICATED, REASON_COLD_LOADS, now_s, signals)
        return TierDecision(POOL, REASON_STAYS, **signals)
    high = _quantile(demand, 0.75)
    signals = {"demand_replicas": high, "attainment": attainment, "cold_loads_per_h": loads_per_h}
    if high > spec.demote_demand_replicas:
        return TierDecision(DEDICATED, REASON_STAYS, **signals)
    if attainment is not None and attainment < spec.demote_attainment:
        return TierDecision(DEDICATED, REASON_SLO_MISSED_DEDICATED, **signals)
    if pool.demand_replicas + high > spec.pool_fill_limit * pool.replicas:
        return TierDecision(DEDICATED, REASON_POOL_FULL, **signals)
    return _bounded(model, history, POOL, REASON_DEMAND_LOW, now_s, signals)
