"""The pool autoscaler's memory floor, as tables beside autoscaler.decide (docs/pools.md, "Scaling")."""

from __future__ import annotations

import pytest
from flotilla_operator import autoscaler as a
from flotilla_operator import pool_types
from flotilla_operator.pool_autoscaler import (
    REASON_MEMORY_FLOOR,
    MemberDemand,
    active_memory_bytes,
    decide_pool,
    memory_floor,
)
from flotilla_operator.pool_manifests import budget_per_replica_bytes
from hypothesis import given
from hypothesis import strategies as st

GI = 1024**3
NOW = 1_800_000_000.0
POOL = a.ScalingSpec(min_replicas=0, max_replicas=4, policy=a.COST_FIRST, target_queue_depth=4,
                     scale_down_stabilization_s=0, scale_to_zero_after_s=60)


@pytest.mark.parametrize(("active_gi", "budget_gi", "max_replicas", "floor"), [
    (0, 2, 4, 0),  # nothing active: the pool may scale to zero
    (1, 2, 4, 1),  # one small model fits one replica
    (2, 2, 4, 1),  # exactly one budget
    (3, 2, 4, 2),  # one byte over a budget needs another replica
    (4, 2, 4, 2),  # the case: four active 1 Gi models, replicas that hold two
    (8, 2, 4, 4),
    (20, 2, 4, 4),  # never past maxReplicas
    (5, 8, 4, 1),
])
def test_memory_floor_table(active_gi, budget_gi, max_replicas, floor):
    assert memory_floor(active_gi * GI, budget_gi * GI, max_replicas) == floor


def test_a_zero_budget_is_refused_with_what_to_change():
    with pytest.raises(ValueError, match="raise memoryBudget"):
        memory_floor(GI, 0, 4)


@pytest.mark.parametrize(("ages_s", "window_s", "active_gi"), [
    ((None, None), 300, 0),  # never used
    ((10, None), 300, 1),
    ((10, 299, 300), 300, 3),  # the window's edge counts
    ((10, 301), 300, 1),  # older than the window: not active
])
def test_active_members_are_those_with_a_request_in_the_window(ages_s, window_s, active_gi):
    members = [MemberDemand(f"m{i}", GI, age) for i, age in enumerate(ages_s)]
    assert active_memory_bytes(members, window_s) == active_gi * GI


@pytest.mark.parametrize(("spec", "budget"), [
    ({"memoryBudget": "3Gi"}, 3 * GI),
    ({"resources": {"memory": "10Gi"}}, 5 * GI),  # CPU: half the pod's memory, as the server's default
    ({"resources": {"gpus": 2, "gpuMemory": "80Gi", "memory": "16Gi"}}, 64 * GI),  # 80% of one GPU (the server's device)
])
def test_budget_per_replica(spec, budget):
    assert budget_per_replica_bytes(pool_types.parse_pool_spec(spec)) == budget


def observe(running: float, waiting: float, current: int, ready: int | None = None, pending: int = 0) -> a.Observation:
    metrics = a.PoolMetrics(waiting=waiting, running=running, slots_per_replica=4, replicas_reporting=current)
    return a.Observation(metrics=metrics, current_replicas=current, ready_replicas=current if ready is None else ready,
                         starting_replicas=0, now_s=NOW, pending_demand=pending)


@pytest.mark.parametrize(("running", "waiting", "pending", "current", "floor", "desired", "reason"), [
    (2, 0, 0, 1, 2, 2, REASON_MEMORY_FLOOR),  # a short queue, but two replicas of active memory
    (2, 0, 0, 2, 2, 2, REASON_MEMORY_FLOOR),  # the queue alone would go down to 1; the floor holds 2
    (2, 0, 0, 2, 0, 1, a.REASON_SCALE_DOWN),  # the same queue with no active member: down
    (30, 10, 0, 1, 2, 4, a.REASON_SCALE_UP),  # demand above the floor decides (ceil(40/8) = 5, clamped to 4)
    (2, 0, 0, 1, 3, 3, REASON_MEMORY_FLOOR),  # under the floor: straight to it, no window
    (0, 0, 3, 0, 0, 1, a.REASON_SCALE_UP),  # held requests at zero wake the pool
    (0, 0, 0, 2, 4, 4, REASON_MEMORY_FLOOR),  # no queue, but four replicas of active memory
    (0, 0, 0, 0, 0, 0, a.REASON_STABLE),  # idle, nothing active: stays at zero
    (0, 0, 0, 1, 9, 4, REASON_MEMORY_FLOOR),  # a floor past maxReplicas is clamped to it
])
def test_decide_pool_table(running, waiting, pending, current, floor, desired, reason):
    state = a.AutoscalerState((a.Recommendation(NOW - 10, current),))  # a tick ago: no first-tick seeding
    decision = decide_pool(POOL, floor, observe(running, waiting, current, pending=pending), state)
    assert (decision.desired_replicas, decision.reason) == (desired, reason), decision.message


def test_missing_metrics_hold_even_under_the_floor():
    obs = a.Observation(metrics=None, current_replicas=1, ready_replicas=1, starting_replicas=0, now_s=NOW)
    decision = decide_pool(POOL, 3, obs, a.AutoscalerState())
    assert (decision.desired_replicas, decision.reason) == (1, a.REASON_METRICS_UNAVAILABLE)


@given(running=st.integers(0, 100), waiting=st.integers(0, 100), pending=st.integers(0, 20),
       current=st.integers(0, 4), floor=st.integers(0, 10))
def test_the_pool_never_goes_under_its_memory_floor_nor_over_its_ceiling(running, waiting, pending, current, floor):
    decision = decide_pool(POOL, floor, observe(running, waiting, current, pending=pending), a.AutoscalerState())
    assert min(floor, POOL.max_replicas) <= decision.desired_replicas <= POOL.max_replicas
    assert decision.reason != REASON_MEMORY_FLOOR or decision.desired_replicas == min(floor, POOL.max_replicas)


@pytest.mark.parametrize(("weight", "floor", "desired", "reason"), [
    (0.0, 1, 1, a.REASON_STABLE),  # a batch flood on one member: the floor's one replica, no more
    (0.0, 0, 1, a.REASON_STABLE),  # batch work alone still keeps a replica (never to zero under it)
    (1.0, 1, 4, a.REASON_SCALE_UP),  # counted in full: ceil(80 / 8) = 10, clamped to 4
])
def test_pool_batch_demand_is_weighted(weight, floor, desired, reason):
    metrics = a.PoolMetrics(waiting=76, running=4, slots_per_replica=4, replicas_reporting=1,
                            waiting_batch=76, running_batch=4)
    obs = a.Observation(metrics=metrics, current_replicas=1, ready_replicas=1, starting_replicas=0, now_s=NOW)
    spec = a.ScalingSpec(**{**POOL.__dict__, "batch_demand_weight": weight})
    decision = decide_pool(spec, floor, obs, a.AutoscalerState((a.Recommendation(NOW - 10, 1),)))
    assert (decision.desired_replicas, decision.reason) == (desired, reason), decision.message


def test_pool_scaling_spec_carries_the_batch_weight():
    from flotilla_operator.handlers.pool_autoscale import scaling_spec

    assert pool_types.parse_pool_spec({}).scaling.batch_demand_weight == 0
    spec = pool_types.parse_pool_spec({"scaling": {"batchDemandWeight": 0.5}})
    assert scaling_spec(spec).batch_demand_weight == 0.5
