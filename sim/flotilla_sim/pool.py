"""Cost-first shared pools: one pool of multi-model servers that every model of the policy shares.

Residency and eviction are the server's own rule, `decide_load` (flotilla_server.model_cache.policy):
a model with demand and no resident copy asks it for room within the pool's memory budget, and loads
(a cold start) or waits. The pool's replicas are the operator's own pool decision,
`flotilla_operator.pool_autoscaler.decide_pool`: `decide` on the pool's aggregate queue plus held
requests, raised to the memory floor (`memory_floor` of `active_memory_bytes`: the models with demand
in the demand window), as the operator's handlers/pool_autoscale.py calls them.

Approximations, stated in docs/simulation.md: the pool is one cache of `replicas x budget` bytes (no
per-replica placement), each model holds one copy, and the GPU time of ready pool replicas is shared
among the loaded models with demand in proportion to that demand.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from flotilla_operator.autoscaler import (
    COST_FIRST,
    AutoscalerState,
    Observation,
    PoolMetrics,
    ScalingSpec,
)
from flotilla_operator.pool_autoscaler import MemberDemand, active_memory_bytes, decide_pool, memory_floor
from flotilla_operator.pool_types import PoolScalingSpec
from flotilla_server.model_cache.policy import Action, Resident, decide_load

from flotilla_sim.server_model import POD_START_S, ServerProfile

DEVICE_MEMORY_BYTES = 80e9  # an H100's 80 GB
BUDGET_SHARE = 0.8  # the multi-model server's default budget: 80% of device memory
MIN_RESIDENCY_S = 60.0  # the multi-model server's default minimum residency
DEMAND_WINDOW_S = float(PoolScalingSpec().demand_window_seconds)  # the CRD's default: the floor counts these
POOL_MAX_REPLICAS = 100_000


class PoolController:
    pooled = True
    wakes = True

    def __init__(self, num_models: int, profile: ServerProfile, tick_s: float, initial_replicas: int = 1,
                 device_memory_bytes: float = DEVICE_MEMORY_BYTES) -> None:
        self.profile = profile
        self.model_bytes = int(profile.weight_bytes)
        self.budget_per_replica = int(BUDGET_SHARE * device_memory_bytes)
        self.spec = ScalingSpec(1, POOL_MAX_REPLICAS, COST_FIRST)
        self.state = AutoscalerState()
        self.pods = initial_replicas
        self.history: deque[int] = deque([initial_replicas], maxlen=max(math.ceil(POD_START_S / tick_s), 0) + 1)
        self.loaded_at = np.full(num_models, np.nan)  # NaN: not resident
        self.ready_at = np.full(num_models, np.nan)
        self.last_used = np.full(num_models, -np.inf)
        self.woken_at = np.full(num_models, np.nan)
        self.cold_starts = 0
        self.evictions = 0

    def _residents(self, busy: np.ndarray) -> list[Resident]:
        return [Resident(str(i), self.model_bytes, float(self.loaded_at[i]), float(self.last_used[i]), bool(busy[i]))
                for i in np.flatnonzero(~np.isnan(self.loaded_at))]

    def _evict(self, names: tuple[str, ...]) -> None:
        for name in names:
            self.loaded_at[int(name)] = self.ready_at[int(name)] = np.nan
            self.evictions += 1

    def ready(self, now_s: float, demand: np.ndarray) -> np.ndarray:
        """Effective ready replicas per model this tick; loads and evicts through decide_load."""
        self.history.append(self.pods)
        pool_ready = min(self.history)
        busy = demand > 0
        self.last_used = np.where(busy, now_s, self.last_used)
        budget = pool_ready * self.budget_per_replica
        if np.isnan(self.loaded_at).size and np.count_nonzero(~np.isnan(self.loaded_at)) * self.model_bytes > budget:
            shrink = decide_load(0, self._residents(busy), budget, now_s, MIN_RESIDENCY_S)
            self._evict(shrink.evict)  # the pool shrank: give back what it no longer holds
        for i in np.flatnonzero(busy & np.isnan(self.loaded_at)):
            decision = decide_load(self.model_bytes, self._residents(busy), budget, now_s, MIN_RESIDENCY_S)
            if decision.action is not Action.LOAD:
                continue  # held at the front door until room frees
            self._evict(decision.evict)
            self.loaded_at[i], self.ready_at[i] = now_s, now_s + self.profile.load_s
            self.woken_at[i] = now_s
            self.cold_starts += 1
        loaded = ~np.isnan(self.ready_at) & (self.ready_at <= now_s) & busy
        share = np.where(loaded, demand, 0.0)
        total = share.sum()
        return pool_ready * share / total if total > 0 else np.zeros_like(demand)

    def decide(self, now_s: float, m) -> None:
        pool_ready = min(self.history)
        metrics = PoolMetrics(float(m.waiting.sum()), float(m.running.sum()), self.profile.slots, pool_ready)
        obs = Observation(metrics, self.pods, pool_ready, self.pods - pool_ready, now_s,
                          pending_demand=math.ceil(float(m.held.sum())))
        # the members with a request on record, with its age (the operator asks Prometheus for the same)
        members = [MemberDemand(str(i), self.model_bytes, now_s - self.last_used[i])
                   for i in np.flatnonzero(np.isfinite(self.last_used)).tolist()]
        floor = memory_floor(active_memory_bytes(members, DEMAND_WINDOW_S), self.budget_per_replica, POOL_MAX_REPLICAS)
        decision = decide_pool(self.spec, floor, obs, self.state)
        self.state = decision.state
        self.pods = decision.desired_replicas
