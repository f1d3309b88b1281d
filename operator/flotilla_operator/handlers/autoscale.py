"""kopf wiring of the autoscaler: a timer per InferenceModel that measures, decides and records.

Every `--autoscale-interval-s` it reads the model, its Deployment and the pool's queue from
Prometheus (and, with `spec.slo`, the latency over the SLO's window), calls the pure `autoscaler.decide`
(and `slo_scaler.decide_slo`, the larger answer winning), writes `.spec.replicas` through the scale
subresource (reconciliation then applies it to the Deployment), and records the decision in
`status.autoscaler` (and `status.slo`), the ScalingActive condition, an Event and the operator's metrics.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import kopf

from flotilla_operator import autoscaler, metrics, rfc3339, slo_scaler, slo_status, types
from flotilla_operator.autoscaler_status import (
    SCALING_DISABLED,
    VALID_METRIC_FOUND,
    scaling_active,
    scaling_condition,
    starting_replicas,
    state_from_status,
    status_patch,
    woken_at,
)
from flotilla_operator.events import object_ref, post_event
from flotilla_operator.kube import KubeError
from flotilla_operator.placement import ADAPTIVE
from flotilla_operator.pool_members import joins_pool
from flotilla_operator.prometheus import PoolSample, PrometheusClient, PrometheusError
from flotilla_operator.reconciler import Context, read_model
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.slo_prometheus import LatencyReading, measure_latency
from flotilla_operator.status_writer import write_status

POOLED = "ScaledByPool"  # ScalingActive reason of a model that joined a ModelPool
NO_DATA = "no_data"  # PROMETHEUS_QUERY_FAILURES reason: the query worked but no ready replica reported


def scaling_spec(spec: types.InferenceModelSpec) -> autoscaler.ScalingSpec:
    s = spec.scaling
    return autoscaler.ScalingSpec(
        # an adaptive model's dedicated replicas are its latency-first tier
        min_replicas=s.min_replicas, max_replicas=s.max_replicas,
        policy=autoscaler.LATENCY_FIRST if spec.placement.policy == ADAPTIVE else spec.placement.policy,
        target_queue_depth=s.target_queue_depth,
        scale_up_stabilization_s=s.scale_up_stabilization_seconds,
        scale_down_stabilization_s=s.scale_down_stabilization_seconds,
        scale_to_zero_after_s=s.scale_to_zero_after_seconds, batch_demand_weight=s.batch_demand_weight,
    )


def pool_metrics(sample: PoolSample | None, spec: types.InferenceModelSpec) -> autoscaler.PoolMetrics | None:
    if sample is None:
        return None
    return autoscaler.PoolMetrics(
        waiting=sample.waiting, running=sample.running,
        slots_per_replica=sample.slots_per_replica or spec.server.max_num_seqs,  # no replica: the spec's slots
        replicas_reporting=sample.replicas_reporting,
        waiting_batch=sample.waiting_batch, running_batch=sample.running_batch,
    )


async def measure(prometheus: PrometheusClient, namespace: str, model: str,
                  logger: logging.Logger | logging.LoggerAdapter) -> PoolSample | None:
    """The pool's sums, or None (counted, logged) when Prometheus fails."""
    try:
        return await prometheus.pool(namespace, model)
    except PrometheusError as error:
        metrics.PROMETHEUS_QUERY_FAILURES.labels(reason=error.reason).inc()
        logger.warning(f"autoscaler: {error}")
        return None


async def measure_slo(prometheus: PrometheusClient, namespace: str, spec: types.InferenceModelSpec,
                      logger: logging.Logger | logging.LoggerAdapter) -> LatencyReading | None:
    """The latency over spec.slo's window, or None (counted, logged) when Prometheus fails."""
    slo = slo_status.slo_targets(spec)
    if slo is None:
        return None
    try:
        return await measure_latency(prometheus, namespace, spec.model.name, slo)
    except PrometheusError as error:
        metrics.PROMETHEUS_QUERY_FAILURES.labels(reason=error.reason).inc()
        logger.warning(f"autoscaler: slo: {error}")
        return None


async def autoscale_once(ctx: Context, prometheus: PrometheusClient, namespace: str, name: str,
                         logger: logging.Logger | logging.LoggerAdapter, now_s: float | None = None) -> None:
    """One decision for one model: measure without the model's lock, then decide and write under it."""
    found = await read_model(ctx.kube, namespace, name)
    if found is None:
        return
    obj, spec = found
    if joins_pool(spec, obj.get("status")):  # a pooled model's replicas do not apply: its ModelPool scales
        async with ctx.lock(namespace, name):  # (an adaptive one's move sets them: handlers/tiering.py)
            await _write_status(ctx, namespace, name, None, False, POOLED,
                                f"the model is served by ModelPool {spec.pool}, which scales; its spec.replicas does not apply"
                                + ("" if spec.placement.policy != ADAPTIVE else " while it is in the pool tier or moving"))
        return
    if spec.scaling.disabled:
        async with ctx.lock(namespace, name):
            await _write_status(ctx, namespace, name, None, False, SCALING_DISABLED,
                                "scaling.disabled is true: .spec.replicas belongs to kubectl, an HPA or KEDA")
        return
    sample = await measure(prometheus, namespace, spec.model.name, logger)
    reading = await measure_slo(prometheus, namespace, spec, logger)
    async with ctx.lock(namespace, name):
        await _decide_and_apply(ctx, namespace, name, sample, logger, time.time() if now_s is None else now_s, reading)


async def _decide_and_apply(ctx: Context, namespace: str, name: str, sample: PoolSample | None,
                            logger: logging.Logger | logging.LoggerAdapter, now_s: float,
                            reading: LatencyReading | None = None) -> None:
    found = await read_model(ctx.kube, namespace, name)  # fresh: history, replicas
    if found is None:
        return
    obj, spec = found
    ref = object_ref(namespace, name, obj["metadata"]["uid"])
    status = obj.get("status") or {}
    current = spec.replicas
    deployment = await ctx.kube.get("apps/v1", "deployments", namespace, name)
    ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    if sample is not None and sample.replicas_reporting == 0 and ready > 0:
        metrics.PROMETHEUS_QUERY_FAILURES.labels(reason=NO_DATA).inc()

    observation = autoscaler.Observation(
        metrics=pool_metrics(sample, spec), current_replicas=current, ready_replicas=ready,
        starting_replicas=starting_replicas(current, deployment), now_s=now_s,
        pending_demand=math.ceil(sample.held) if sample is not None else 0,
        woken_at_s=woken_at(obj),
    )
    state = state_from_status(status.get("autoscaler"))
    queue = autoscaler.decide(scaling_spec(spec), observation, state)
    desired, reason, message = queue.desired_replicas, queue.reason, queue.message
    slo = slo_status.slo_targets(spec)
    slo_decision = None
    if slo is not None:  # with an SLO, the larger of the two rules' answers wins
        latency, missing_reason, missing_why = slo_status.latency_observation(reading, slo.window_s, ready)
        slo_observation = slo_scaler.SloObservation(latency, observation.metrics, current, ready,
                                                    observation.starting_replicas, now_s,
                                                    missing_reason or autoscaler.REASON_METRICS_UNAVAILABLE, missing_why)
        slo_decision = slo_scaler.decide_slo(scaling_spec(spec), slo, slo_observation,
                                             slo_status.state_from_status(status.get("autoscaler")))
        desired, reason, message = slo_scaler.combine(queue, slo_decision)
    direction = "up" if desired > current else "down" if desired < current else "hold"
    metrics.AUTOSCALER_DECISIONS.labels(namespace=namespace, model=spec.model.name, direction=direction,
                                        reason=reason).inc()
    metrics.DESIRED_REPLICAS.labels(namespace=namespace, model=spec.model.name).set(desired)

    if desired != current:
        await ctx.kube.patch(types.API_VERSION, types.PLURAL, namespace, name,
                             {"spec": {"replicas": desired}}, subresource="scale")
        logger.info(f"autoscaler: {current} -> {desired}: {message}")
        await post_event(ctx.kube, ref, "Normal", reason, f"{current} -> {desired}: {message}")

    queue_unavailable = queue.reason == autoscaler.REASON_METRICS_UNAVAILABLE
    slo_unavailable = slo_decision is not None and slo_decision.reason in slo_scaler.HOLDS
    unavailable = queue_unavailable or slo_unavailable
    held_by = queue if queue_unavailable else slo_decision
    why_reason, why = (held_by.reason, held_by.message) if unavailable and held_by is not None else ("", "")
    if unavailable and scaling_active(status.get("conditions")) is not False:
        await post_event(ctx.kube, ref, "Warning", why_reason, why)
    previous = status.get("autoscaler") or {}
    autoscaler_status = status_patch(queue, current, sample.waiting if sample else None, now_s,
                                     previous.get("lastScaleTime"))
    autoscaler_status["lastDecision"] = f"{reason}: {current} -> {desired}: {message}"
    autoscaler_status["lastReason"] = reason
    autoscaler_status["lastScaleTime"] = rfc3339.format_time(now_s) if desired != current else previous.get("lastScaleTime")
    if queue_unavailable:  # missing data changes nothing remembered
        autoscaler_status["recommendations"] = previous.get("recommendations") or []
        autoscaler_status["idleSince"] = previous.get("idleSince")
    extra: dict[str, Any] = {}
    if slo is not None and slo_decision is not None:
        autoscaler_status["slo"] = (previous.get("slo") if slo_unavailable else
                                    slo_status.state_patch(slo_decision.state))
        extra["slo"] = slo_status.figures(slo, reading, slo_decision, now_s)
    elif "slo" in status or "slo" in previous:  # spec.slo was removed: so are its figures and memory (merge patch)
        autoscaler_status["slo"] = extra["slo"] = None
    await _write_status(ctx, namespace, name, autoscaler_status, not unavailable,
                        why_reason if unavailable else VALID_METRIC_FOUND, why if unavailable else message, extra)


async def _write_status(ctx: Context, namespace: str, name: str, autoscaler_status: dict[str, Any] | None,
                        ok: bool, reason: str, message: str, extra: dict[str, Any] | None = None) -> None:
    """Write status.autoscaler (and `extra`: status.slo) and ScalingActive against the version just read
    (status_writer retries on conflict)."""
    async def compute(obj: dict[str, Any]) -> dict[str, Any] | None:
        status = obj.get("status") or {}
        conditions = scaling_condition(status.get("conditions"), ok, reason, message, rfc3339.now(),
                                       obj["metadata"].get("generation", 1))
        if autoscaler_status is None and status.get("conditions") == conditions:
            return None  # nothing changed
        return ({"conditions": conditions} | ({"autoscaler": autoscaler_status} if autoscaler_status is not None else {})
                | (extra or {}))

    await write_status(ctx.kube, namespace, name, compute)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    resource = (types.GROUP, types.VERSION, types.PLURAL)

    @kopf.on.startup(id="autoscaler-start", registry=registry)
    async def start(memo: kopf.Memo, **_: Any) -> None:
        memo.prometheus = PrometheusClient(settings.prometheus_url)

    @kopf.on.cleanup(id="autoscaler-stop", registry=registry)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "prometheus", None) is not None:
            await memo.prometheus.aclose()

    @kopf.timer(*resource, id="autoscale", interval=settings.autoscale_interval_s,
                initial_delay=settings.autoscale_interval_s, registry=registry)
    async def autoscale(name: str, namespace: str, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        ctx: Context | None = getattr(memo, "ctx", None)
        prometheus: PrometheusClient | None = getattr(memo, "prometheus", None)
        if ctx is None or prometheus is None:
            return
        try:
            await autoscale_once(ctx, prometheus, namespace, name, logger)
        except KubeError as error:  # the next tick decides again from fresh state; no kopf retry storm
            logger.warning(f"autoscaler: {namespace}/{name}: {error}")
