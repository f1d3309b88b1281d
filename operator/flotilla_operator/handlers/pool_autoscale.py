"""kopf wiring of the pool autoscaler: a timer per ModelPool that measures, decides and records.

Every `--autoscale-interval-s`: the pool's aggregate queue, the requests the gateway holds for its members
and the members active in the demand window, from Prometheus (pool_prometheus); then, under the pool's
lock, the pure `pool_autoscaler.decide_pool` (decide() above the memory floor), a PATCH of the pool's
scale subresource when the replicas change, and `status.autoscaler` plus ScalingActive on the pool.
Held requests are demand (`P`), so a pool is never scaled to zero while a member's requests are held; nor
within scaleToZeroAfterSeconds of the `flotilla.dev/woken-at` stamp a gateway puts on the pool it wakes,
as for a model (its held requests may not be in Prometheus yet).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import kopf
import pydantic
from flotilla_contract.sizes import parse_bytes

from flotilla_operator import autoscaler, metrics, pool_types, rfc3339, types
from flotilla_operator.autoscaler_status import (
    SCALING_DISABLED,
    VALID_METRIC_FOUND,
    scaling_condition,
    starting_replicas,
    state_from_status,
    status_patch,
    woken_at,
)
from flotilla_operator.events import post_event
from flotilla_operator.kube import KubeError
from flotilla_operator.pool_autoscaler import (
    MemberDemand,
    active_memory_bytes,
    decide_pool,
    memory_floor,
)
from flotilla_operator.pool_manifests import budget_per_replica_bytes, pool_deployment_name
from flotilla_operator.pool_prometheus import PoolDemand, measure_pool
from flotilla_operator.pool_reconciler import pool_lock_key, pool_ref
from flotilla_operator.prometheus import PrometheusClient, PrometheusError
from flotilla_operator.reconciler import Context
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.status_writer import write_status


def scaling_spec(spec: pool_types.ModelPoolSpec) -> autoscaler.ScalingSpec:
    s = spec.scaling
    return autoscaler.ScalingSpec(
        min_replicas=s.min_replicas, max_replicas=s.max_replicas, policy=spec.placement.policy,
        target_queue_depth=s.target_queue_depth, scale_up_stabilization_s=s.scale_up_stabilization_seconds,
        scale_down_stabilization_s=s.scale_down_stabilization_seconds, scale_to_zero_after_s=s.scale_to_zero_after_seconds,
        batch_demand_weight=s.batch_demand_weight,
    )


def floor_of(spec: pool_types.ModelPoolSpec, active_models: frozenset[str]) -> int:
    """The memory floor: every active member counted at modelMemory."""
    per_model = parse_bytes(spec.model_memory)
    demands = [MemberDemand(model, per_model, 0.0) for model in active_models]
    return memory_floor(active_memory_bytes(demands, spec.scaling.demand_window_seconds),
                        budget_per_replica_bytes(spec), spec.scaling.max_replicas)


async def autoscale_pool_once(ctx: Context, prometheus: PrometheusClient, namespace: str, name: str,
                              logger: logging.Logger | logging.LoggerAdapter, now_s: float | None = None) -> None:
    """One decision for one pool: measure without the pool's lock, then decide and write under it."""
    obj = await ctx.kube.get(types.API_VERSION, pool_types.PLURAL, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return
    try:
        spec = pool_types.parse_pool_spec(obj.get("spec") or {})
    except pydantic.ValidationError:
        return  # the reconciler reports an unreadable spec as Degraded
    async with ctx.lock(namespace, pool_lock_key(name)):
        if spec.scaling.disabled:
            await _write(ctx, namespace, name, None, False, SCALING_DISABLED,
                         "scaling.disabled is true: .spec.replicas belongs to kubectl, an HPA or KEDA")
            return
    models = [m["model"] for m in (obj.get("status") or {}).get("members") or []]
    demand: PoolDemand | None = None
    try:
        demand = await measure_pool(prometheus, namespace, name, models, spec.scaling.demand_window_seconds)
    except PrometheusError as error:
        metrics.PROMETHEUS_QUERY_FAILURES.labels(reason=error.reason).inc()
        logger.warning(f"pool autoscaler: {error}")
    async with ctx.lock(namespace, pool_lock_key(name)):
        await _decide_and_apply(ctx, namespace, name, demand, logger, time.time() if now_s is None else now_s)


async def _decide_and_apply(ctx: Context, namespace: str, name: str, demand: PoolDemand | None,
                            logger: logging.Logger | logging.LoggerAdapter, now_s: float) -> None:
    obj = await ctx.kube.get(types.API_VERSION, pool_types.PLURAL, namespace, name)  # fresh: history, replicas
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return
    spec = pool_types.parse_pool_spec(obj.get("spec") or {})
    status, current = obj.get("status") or {}, spec.replicas
    deployment = await ctx.kube.get("apps/v1", "deployments", namespace, pool_deployment_name(name))
    ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    pool_metrics = None if demand is None else autoscaler.PoolMetrics(
        waiting=demand.sample.waiting, running=demand.sample.running,
        slots_per_replica=demand.sample.slots_per_replica or spec.server.max_num_seqs,
        replicas_reporting=demand.sample.replicas_reporting,
        waiting_batch=demand.sample.waiting_batch, running_batch=demand.sample.running_batch)
    observation = autoscaler.Observation(
        metrics=pool_metrics, current_replicas=current, ready_replicas=ready,
        starting_replicas=starting_replicas(current, deployment), now_s=now_s,
        pending_demand=math.ceil(demand.held) if demand else 0, woken_at_s=woken_at(obj))
    floor = floor_of(spec, demand.active_models) if demand else 0
    decision = decide_pool(scaling_spec(spec), floor, observation, state_from_status(status.get("autoscaler")))
    if decision.desired_replicas != current:
        await ctx.kube.patch(types.API_VERSION, pool_types.PLURAL, namespace, name,
                             {"spec": {"replicas": decision.desired_replicas}}, subresource="scale")
        logger.info(f"pool autoscaler: {current} -> {decision.desired_replicas}: {decision.message}")
        await post_event(ctx.kube, pool_ref(namespace, name, obj["metadata"]["uid"]), "Normal", decision.reason,
                         f"{current} -> {decision.desired_replicas}: {decision.message}")
    unavailable = decision.reason == autoscaler.REASON_METRICS_UNAVAILABLE
    previous = status.get("autoscaler") or {}
    patch = status_patch(decision, current, demand.sample.waiting if demand else None, now_s,
                         previous.get("lastScaleTime"))
    if unavailable:  # missing data changes nothing remembered
        patch["recommendations"] = previous.get("recommendations") or []
        patch["idleSince"] = previous.get("idleSince")
    await _write(ctx, namespace, name, patch, not unavailable,
                 decision.reason if unavailable else VALID_METRIC_FOUND, decision.message)


async def _write(ctx: Context, namespace: str, name: str, autoscaler_status: dict[str, Any] | None,
                 ok: bool, reason: str, message: str) -> None:
    async def compute(obj: dict[str, Any]) -> dict[str, Any] | None:
        status = obj.get("status") or {}
        conditions = scaling_condition(status.get("conditions"), ok, reason, message, rfc3339.now(),
                                       obj["metadata"].get("generation", 1))
        if autoscaler_status is None and status.get("conditions") == conditions:
            return None
        return {"conditions": conditions} | ({"autoscaler": autoscaler_status} if autoscaler_status is not None else {})

    await write_status(ctx.kube, namespace, name, compute, plural=pool_types.PLURAL)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    @kopf.timer(types.GROUP, types.VERSION, pool_types.PLURAL, id="autoscale-pool", interval=settings.autoscale_interval_s,
                initial_delay=settings.autoscale_interval_s, registry=registry)
    async def autoscale(name: str, namespace: str, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        ctx: Context | None = getattr(memo, "ctx", None)
        prometheus: PrometheusClient | None = getattr(memo, "prometheus", None)  # started by handlers/autoscale.py
        if ctx is None or prometheus is None:
            return
        try:
            await autoscale_pool_once(ctx, prometheus, namespace, name, logger)
        except KubeError as error:  # the next tick decides again from fresh state
            logger.warning(f"pool autoscaler: {namespace}/{name}: {error}")
