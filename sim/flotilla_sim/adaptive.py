"""`adaptive`: each model in the shared pool or on dedicated replicas, as the operator's `decide_tier` says
(flotilla_operator.tiering), moved make-before-break.

Every piece of policy is the operator's, imported unchanged: the tier (`decide_tier`, once per model per
autoscaler tick), the pool's residency and replicas (pool.PoolController: the server's `decide_load` and the
operator's `decide_pool`), and a dedicated model's replicas: with an SLO, the operator's `decide_slo` beside
the cost-first `decide`, the larger winning (slo_policies.SloController, as handlers/autoscale.py combines
them): the SLO says how much headroom the model needs; without one, the latency-first `decide`; min 1 either
way. What lives
here is the mechanism the operator and the gateway carry out, as issue 37 describes the moves:
- promotion: the model's Deployment is created, sized for the demand the pool carries (slots SLOT_FILL full,
  as the SLO scaler counts them), while the pool keeps serving it; when those replicas are ready the route
  switches, and the pool stops seeing its demand (its copy then ages out by LRU);
- demotion: the pool is handed the model's demand (a cold load) while its replicas keep serving it; when the
  pool holds it ready the route switches and the Deployment goes to zero.
So a model is always served from the tier it is in until the other is ready: no request is dropped by a
move, and none waits longer than the pool's cold load would have made it.

Signals read per model each tick, as the operator reads them from Prometheus: demand in replicas' worth of
slots ((running + waiting + held) / slots), TTFT SLO attainment over the SLO window (the share of first
tokens within the target, from the servers' histograms: latency.LatencyView), and the pool's cold loads.
Approximations, as pool.py's: the pool is one cache of `replicas x budget` bytes.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from flotilla_operator.autoscaler import (
    COST_FIRST,
    LATENCY_FIRST,
    AutoscalerState,
    Observation,
    PoolMetrics,
    ScalingSpec,
    decide,
)
from flotilla_operator.slo_scaler import SLOT_FILL, SloState, SloTargets
from flotilla_operator.tiering import (
    DEDICATED,
    POOL,
    ModelTier,
    PoolView,
    TierHistory,
    TieringSpec,
    TierSample,
    decide_tier,
)

from flotilla_sim.latency import TTFT_BOUNDS
from flotilla_sim.policies import MAX_REPLICAS, Metrics
from flotilla_sim.pool import PoolController
from flotilla_sim.server_model import ServerProfile
from flotilla_sim.slo_policies import SloController

HOUR_S = 3600.0


def attainment(ttft_counts: np.ndarray, target_s: float) -> np.ndarray:
    """The share of each model's first tokens within `target_s` ([models, buckets] counts, NaN without any):
    whole buckets at or under the target, and the bucket holding it in proportion, as histogram_quantile
    reads inside a bucket."""
    cumulative = np.cumsum(ttft_counts, axis=1)
    total = cumulative[:, -1]
    b = int(np.searchsorted(TTFT_BOUNDS, target_s, side="left"))  # the bucket holding the target
    below = cumulative[:, b - 1] if b > 0 else np.zeros(len(total))
    if b < len(TTFT_BOUNDS):
        start = TTFT_BOUNDS[b - 1] if b > 0 else 0.0
        below = below + ttft_counts[:, b] * (target_s - start) / (TTFT_BOUNDS[b] - start)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, below / total, np.nan)


class AdaptiveController:
    """The fluid loop's pooled-controller interface (pool.PoolController's): `ready`, `pods`, `woken_at`,
    `decide`, `cold_starts`; plus `report()`, the moves it made."""

    pooled = True
    wakes = True
    needs_latency = True

    def __init__(self, num_models: int, profile: ServerProfile, tick_s: float, slo: SloTargets | None,
                 spec: TieringSpec = TieringSpec()) -> None:
        """`slo`: the models' spec.slo (None: none, so dedicated replicas keep latency-first's headroom, and
        decide_tier reads no attainment)."""
        self.profile, self.slo, self.spec = profile, slo, spec
        self.window_s = slo.window_s if slo is not None else 60.0  # the fluid loop's latency window
        self.pool = PoolController(num_models, profile, tick_s)
        self.dedicated_spec = ScalingSpec(1, MAX_REPLICAS, LATENCY_FIRST)
        self.states = [AutoscalerState() for _ in range(num_models)]
        self.slo_rule = None if slo is None else SloController(ScalingSpec(1, MAX_REPLICAS, COST_FIRST), slo, num_models,
                                                               profile.slots, queue=True)
        self.n = np.zeros(num_models, dtype=np.int64)  # dedicated pods per model (starting ones included)
        self.started: deque[np.ndarray] = deque([self.n.copy()], maxlen=max(math.ceil(profile.start_s / tick_s), 0) + 1)
        self.dedicated = np.zeros(num_models, dtype=bool)  # the tier that serves the model now
        self.moving = np.zeros(num_models, dtype=bool)  # a move to the other tier in flight
        self.since_s = np.full(num_models, -math.inf)
        self.samples: list[deque[TierSample]] = [deque() for _ in range(num_models)]
        self.cold_loads = np.zeros(num_models, dtype=np.int64)  # since the last decision
        self.fleet_moves_s: deque[float] = deque()  # the last hour's, for decide_tier
        self.moves_s: list[float] = []  # every move's start, for the report
        self.promote_to = np.ones(num_models, dtype=np.int64)  # replicas a promotion waits for
        self.promotions = self.demotions = 0
        self.reasons: dict[str, int] = {}

    @property
    def pods(self) -> int:
        return int(self.pool.pods + self.n.sum())

    @property
    def woken_at(self) -> np.ndarray:
        return self.pool.woken_at

    @property
    def cold_starts(self) -> int:
        return self.pool.cold_starts

    def _pool_serves_or_loads(self) -> np.ndarray:
        return ~self.dedicated | self.moving  # in the pool, or being demoted into it

    def ready(self, now_s: float, demand: np.ndarray) -> np.ndarray:
        self.started.append(self.n.copy())
        dedicated_ready = np.minimum.reduce(self.started)
        woken_before = self.pool.woken_at.copy()
        share = self.pool.ready(now_s, np.where(self._pool_serves_or_loads(), demand, 0.0))
        self.cold_loads += (self.pool.woken_at == now_s) & (woken_before != now_s)
        promoted = ~self.dedicated & self.moving & (dedicated_ready >= self.promote_to)
        in_pool = ~np.isnan(self.pool.ready_at) & (self.pool.ready_at <= now_s)
        # a demotion completes once the pool holds the model ready, or at once while nothing asks for it (the
        # pool loads it on its next request, as it does any idle member)
        demoted = self.dedicated & self.moving & (in_pool | (demand <= 0))
        if promoted.any() or demoted.any():
            done = promoted | demoted
            self.dedicated[promoted], self.dedicated[demoted] = True, False
            self.moving[done], self.since_s[done] = False, now_s
            self.n[demoted] = 0
            for i in np.flatnonzero(demoted):
                self._forget(i)
        return np.where(self.dedicated, dedicated_ready.astype(np.float64), share)

    def decide(self, now_s: float, m: Metrics) -> None:
        pool_side = self._pool_serves_or_loads()
        self.pool.decide(now_s, Metrics(np.where(pool_side, m.running, 0.0), np.where(pool_side, m.waiting, 0.0),
                                        np.where(pool_side, m.held, 0.0), m.replicas, m.ready, m.woken_at_s))
        dedicated_ready = np.minimum.reduce(self.started)
        # a promotion's Deployment keeps the size it started with until the route switches (then it scales)
        dedicated_side = np.flatnonzero(self.dedicated)
        if self.slo_rule is not None:  # the SLO beside the cost-first queue rule; pool-side answers unused
            seen = Metrics(m.running, m.waiting, m.held, self.n.copy(), dedicated_ready.astype(np.int64), m.woken_at_s,
                           latency=m.latency)
            want = self.slo_rule.decide(now_s, seen)
            self.n[dedicated_side] = np.maximum(want[dedicated_side], 1)
            dedicated_side = dedicated_side[:0]
        # without an SLO: latency-first `decide` for models served there
        for i in dedicated_side.tolist():
            obs = Observation(PoolMetrics(float(m.waiting[i]), float(m.running[i]), self.profile.slots,
                                          int(dedicated_ready[i])),
                              int(self.n[i]), int(dedicated_ready[i]), int(self.n[i] - dedicated_ready[i]), now_s,
                              pending_demand=math.ceil(float(m.held[i])))
            result = decide(self.dedicated_spec, obs, self.states[i])
            self.states[i] = result.state
            self.n[i] = max(result.desired_replicas, 1)
        self._decide_tiers(now_s, m)

    def _decide_tiers(self, now_s: float, m: Metrics) -> None:
        demand = ((m.running + m.waiting + m.held) / self.profile.slots).tolist()
        met = None if m.latency is None or self.slo is None or self.slo.ttft_s is None else \
            attainment(m.latency.ttft_counts, self.slo.ttft_s)
        pool_side = self._pool_serves_or_loads()
        pool_demand = float(np.sum(np.where(pool_side, demand, 0.0)))
        pool_replicas = float(min(self.pool.history))
        horizon_s = self.spec.window_s + HOUR_S  # samples kept: the window, with room for a slow clock
        while self.fleet_moves_s and self.fleet_moves_s[0] <= now_s - HOUR_S:
            self.fleet_moves_s.popleft()
        moves = tuple(self.fleet_moves_s)
        for i, level in enumerate(demand):
            seen = None if met is None or math.isnan(met[i]) else float(met[i])
            samples = self.samples[i]
            samples.append(TierSample(now_s, level, seen, int(self.cold_loads[i])))
            while samples and samples[0].at_s < now_s - horizon_s:
                samples.popleft()
            if self.moving[i]:
                continue
            tier = DEDICATED if self.dedicated[i] else POOL
            others = pool_demand - (level if pool_side[i] else 0.0)
            decision = decide_tier(TierHistory(tuple(samples), moves), PoolView(pool_replicas, others),
                                   ModelTier(tier, float(self.since_s[i]), self.spec), now_s)
            if decision.moves_from(tier):
                self.moving[i] = True
                self.fleet_moves_s.append(now_s)
                self.moves_s.append(now_s)
                moves = tuple(self.fleet_moves_s)
                self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
                if tier == POOL:
                    self.promotions += 1
                    self._forget(i)
                    # the Deployment starts sized for the demand the pool carries now, and takes the route once
                    # all of it is ready: one replica would take a busy model's whole stream alone
                    self.n[i] = self.promote_to[i] = max(1, math.ceil(level / SLOT_FILL))
                else:
                    self.demotions += 1
        self.cold_loads[:] = 0

    def _forget(self, i: int) -> None:
        """A fresh autoscaler memory for model i's dedicated replicas (a new Deployment's status)."""
        self.states[i] = AutoscalerState()
        if self.slo_rule is not None:
            self.slo_rule.states[i], self.slo_rule.queue_states[i] = SloState(), AutoscalerState()

    def report(self, duration_s: float) -> dict:
        """What the run's JSON records of the moves: counts, per hour, reasons, and who ended where."""
        moves = self.promotions + self.demotions
        return {"promotions": self.promotions, "demotions": self.demotions,
                "moves_per_hour": moves * HOUR_S / duration_s if duration_s > 0 else 0.0,
                "move_reasons": dict(sorted(self.reasons.items())),
                "dedicated_at_end": int(self.dedicated.sum())}
