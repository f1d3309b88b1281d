"""One tiering tick of an adaptive model: observe, call the pure decision (tiering.decide_tier) or the move's
next step (tier_moves.advance), and carry the answer out: status, Events, and the children that follow.

The shell around the two pure modules, in the reconciler's shape: it writes status.tier, status.tierSince,
status.move and status.tiering, then reconciles the model and its pool at once, so that the Deployment, the
Service, the pool's members file and status.pool (the gateway's route) follow the new phase in the same tick
(tier_state.model_children derives them all from status). Prometheus is read without the model's lock; the
decision and its writes happen under it, against a fresh read.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
from flotilla_contract.labels import WOKEN_AT_ANNOTATION
from flotilla_contract.load import MODEL_LOAD_PATH

from flotilla_operator import metrics, pool_types, rfc3339, slo_status, tier_moves, tier_prometheus, types
from flotilla_operator.events import object_ref, post_event
from flotilla_operator.manifests import pod_selector_string
from flotilla_operator.placement import ADAPTIVE
from flotilla_operator.pool_join import read_pool
from flotilla_operator.pool_manifests import pool_deployment_name, pool_selector_string
from flotilla_operator.pool_members import member_source
from flotilla_operator.pool_reconciler import sync_pools
from flotilla_operator.pool_residency import load_url, read_loads
from flotilla_operator.prometheus import PrometheusClient, PrometheusError
from flotilla_operator.reconciler import Context, list_claimants, read_model, reconcile
from flotilla_operator.slo_prometheus import measure_latency
from flotilla_operator.status import Problem
from flotilla_operator.status_writer import write_status
from flotilla_operator.tier_state import TierState, move_status, read_state
from flotilla_operator.tiering import (
    DEDICATED,
    HOUR_S,
    POOL,
    REASON_POOL_CANNOT_HOLD,
    ModelTier,
    PoolView,
    TierDecision,
    TierHistory,
    TierSample,
    decide_tier,
)
from flotilla_operator.tiering_types import TieringSpec

PRELOAD_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class PoolFacts:
    view: PoolView
    refusal: str | None  # why the pool cannot take the model; None: it can (or it is not known yet)
    loaded: bool  # a pool pod reports the model loaded
    pods: tuple[dict[str, Any], ...] = ()  # the pool's running pods
    asleep: bool = False  # the pool is scaled to zero


def tiering_spec(spec: types.InferenceModelSpec) -> TieringSpec:
    return spec.tiering or TieringSpec()


def _ready(deployment: dict[str, Any] | None) -> int:
    return int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)


async def pool_facts(ctx: Context, namespace: str, spec: types.InferenceModelSpec, demand_replicas: float = 0.0
                     ) -> PoolFacts:
    """The pool as the decision and a move see it: ready replicas and its other members' `demand_replicas`,
    whether it can hold the model (its source is poolable, and no pod reports the model larger than its memory
    budget), whether a pod holds it loaded."""
    pool_name = spec.pool or ""
    pool = await read_pool(ctx.kube, namespace, pool_name)
    if pool is None:
        return PoolFacts(PoolView(0.0, 0.0, can_hold=False), f'ModelPool "{pool_name}" does not exist', False)
    if isinstance(problem := member_source(spec, pool), Problem):
        return PoolFacts(PoolView(0.0, 0.0, can_hold=False), problem.message, False)
    deployment = await ctx.kube.get("apps/v1", "deployments", namespace, pool_deployment_name(pool_name))
    pods = [p for p in await ctx.kube.list("v1", "pods", namespace, pool_selector_string(pool_name))
            if load_url(p) is not None]
    reports = await read_loads(pods)
    refusal, loaded = None, False
    for report in reports.values():
        if report is None:
            continue
        for model in report.models:
            if model.name != spec.model.name:
                continue
            loaded = loaded or model.state == "loaded"
            budget = report.memory_budget_bytes
            if budget is not None and model.memory_bytes is not None and model.memory_bytes > budget:
                refusal = (f"ModelPool {pool_name}'s memory budget ({budget} bytes) cannot hold the model "
                           f"({model.memory_bytes} bytes with its KV pool); raise the pool's memoryBudget")
    return PoolFacts(PoolView(float(_ready(deployment)), demand_replicas, can_hold=refusal is None), refusal, loaded,
                     tuple(pods), asleep=pool.replicas == 0)


async def fleet_moves(ctx: Context, namespace: str, now_s: float) -> tuple[float, ...]:
    """Start times of every adaptive model's moves in the last hour, as their status recorded them."""
    starts = []
    for obj in await list_claimants(ctx.kube, namespace):
        for moved in ((obj.get("status") or {}).get("tiering") or {}).get("moves") or []:
            at_s = rfc3339.parse_time(moved)
            if now_s - HOUR_S < at_s <= now_s:
                starts.append(at_s)
    return tuple(sorted(starts))


@dataclass(frozen=True)
class Readings:
    samples: tuple[TierSample, ...]  # the model's, over the window
    pool_demand_replicas: float  # the pool's other members' demand now


async def read_history(ctx: Context, prometheus: PrometheusClient, namespace: str, spec: types.InferenceModelSpec
                       ) -> Readings:
    """The decision's samples over the window, and the pool's other demand (PrometheusError on failure)."""
    slo = slo_status.slo_targets(spec)
    reading = await measure_latency(prometheus, namespace, spec.model.name, slo) if slo is not None else None
    tuning = tiering_spec(spec)
    step_s = min(ctx.settings.autoscale_interval_s, tuning.window_seconds / 10)
    samples = await tier_prometheus.read_samples(prometheus, namespace, spec.model.name, spec.server.max_num_seqs,
                                                 float(tuning.window_seconds), step_s,
                                                 tier_prometheus.attainment(reading, slo))
    pool = await read_pool(ctx.kube, namespace, spec.pool or "")
    other = 0.0
    if pool is not None:
        other = await tier_prometheus.read_pool_demand(prometheus, namespace, spec.pool or "", spec.model.name,
                                                       pool.server.max_num_seqs)
    return Readings(samples, other)


async def wake_pool(ctx: Context, namespace: str, pool_name: str) -> None:
    """Scale a pool at zero to one, stamped as a gateway stamps a wake, so its autoscaler keeps it up for
    scaleToZeroAfterSeconds: a demotion needs a pool pod to load the model."""
    await ctx.kube.patch(types.API_VERSION, pool_types.PLURAL, namespace, pool_name, {"spec": {"replicas": 1}},
                         subresource="scale")
    await ctx.kube.patch(types.API_VERSION, pool_types.PLURAL, namespace, pool_name,
                         {"metadata": {"annotations": {WOKEN_AT_ANNOTATION: rfc3339.now()}}})


async def preload(pods: tuple[dict[str, Any], ...], model: str) -> str | None:
    """Ask the first pool pod to load `model` (POST MODEL_LOAD_PATH); returns the pod's refusal (400: its budget
    can never hold the model), None otherwise (202 loading, 200 loaded, 404 not listed yet, no answer)."""
    for pod in pods:
        url = load_url(pod)
        if url is None:
            continue
        base = url.rsplit("/flotilla/", 1)[0]
        try:
            async with httpx.AsyncClient(timeout=PRELOAD_TIMEOUT_S) as client:
                answer = await client.post(base + MODEL_LOAD_PATH.format(name=model))
        except httpx.HTTPError:
            continue
        if answer.status_code == 400:
            return str((answer.json().get("error") or {}).get("message") or "the pool refused to load the model")
        return None
    return None


def decision_text(decision: TierDecision, tier: str) -> str:
    attainment = "n/a" if decision.attainment is None else f"{decision.attainment:.3f}"
    demand = "n/a" if math.isnan(decision.demand_replicas) else f"{decision.demand_replicas:.2f}"
    return (f"{decision.reason}: {tier} -> {decision.tier} (demand {demand} replicas, attainment {attainment}, "
            f"cold loads {decision.cold_loads_per_h:.1f}/h)")


async def tier_once(ctx: Context, prometheus: PrometheusClient, namespace: str, name: str,
                    logger: logging.Logger | logging.LoggerAdapter, now_s: float | None = None) -> None:
    """One tick for one adaptive model: a move's next step, or a decision (which may start a move)."""
    found = await read_model(ctx.kube, namespace, name)
    if found is None or found[1].placement.policy != ADAPTIVE:
        return
    obj, spec = found
    state = read_state(obj.get("status"))
    readings = Readings((), 0.0)
    if state.move is None:
        try:
            readings = await read_history(ctx, prometheus, namespace, spec)
        except PrometheusError as error:
            metrics.PROMETHEUS_QUERY_FAILURES.labels(reason=error.reason).inc()
            logger.warning(f"tiering: {error}")
            return  # hold, as the autoscalers do through an outage
    async with ctx.lock(namespace, name):
        await _step(ctx, namespace, name, readings, logger, time.time() if now_s is None else now_s)


async def _step(ctx: Context, namespace: str, name: str, readings: Readings,
                logger: logging.Logger | logging.LoggerAdapter, now_s: float) -> None:
    found = await read_model(ctx.kube, namespace, name)  # fresh, under the lock
    if found is None:
        return
    obj, spec = found
    state = read_state(obj.get("status"))
    facts = await pool_facts(ctx, namespace, spec, readings.pool_demand_replicas)
    if state.move is None:
        await _decide(ctx, obj, spec, state, facts, readings.samples, logger, now_s)
    else:
        await _advance(ctx, obj, spec, state, facts, logger, now_s)


async def _decide(ctx: Context, obj: dict[str, Any], spec: types.InferenceModelSpec, state: TierState,
                  facts: PoolFacts, samples: tuple, logger: logging.Logger | logging.LoggerAdapter,
                  now_s: float) -> None:
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    tuning = tiering_spec(spec)
    decision_spec = tuning.decision(ctx.settings.tier_moves_per_hour)
    history = TierHistory(samples, await fleet_moves(ctx, namespace, now_s))
    decision = decide_tier(history, facts.view, ModelTier(state.tier, state.since_s, decision_spec), now_s)
    text = decision_text(decision, state.tier)
    metrics.TIER_DECISIONS.labels(namespace=namespace, model=spec.model.name, reason=decision.reason.split(":")[0]).inc()
    previous = (obj.get("status") or {}).get("tiering") or {}
    tiering_status = {
        "lastDecision": text, "reason": decision.reason,
        "demandReplicas": None if math.isnan(decision.demand_replicas) else round(decision.demand_replicas, 4),
        "attainment": decision.attainment, "coldLoadsPerHour": round(decision.cold_loads_per_h, 3),
        "observedAt": rfc3339.format_time(now_s),
        "moves": [m for m in previous.get("moves") or [] if now_s - HOUR_S < rfc3339.parse_time(m) <= now_s],
        "degraded": previous.get("degraded"),
    }
    patch: dict[str, Any] = {"tier": state.tier}
    if decision.reason == REASON_POOL_CANNOT_HOLD:
        tiering_status["degraded"] = {"reason": REASON_POOL_CANNOT_HOLD,
                                      "message": f"{facts.refusal}: the model is served by dedicated replicas"}
    if not decision.moves_from(state.tier):
        await _write(ctx, namespace, name, patch | {"tiering": tiering_status})
        return
    replicas = max(1, math.ceil(decision.demand_replicas)) if not math.isnan(decision.demand_replicas) else 1
    replicas = min(replicas, spec.scaling.max_replicas)
    step = tier_moves.start(state.tier, decision.reason, replicas, now_s)
    if step.move is not None and step.move.to == DEDICATED and spec.replicas != step.move.replicas:
        await ctx.kube.patch(types.API_VERSION, types.PLURAL, namespace, name,
                             {"spec": {"replicas": step.move.replicas}}, subresource="scale")
    tiering_status["moves"] = [*tiering_status["moves"], rfc3339.format_time(now_s)]
    if decision.reason != REASON_POOL_CANNOT_HOLD:
        tiering_status["degraded"] = None  # a new attempt: the last rollback's reason no longer stands
    metrics.TIER_MOVES.labels(namespace=namespace, model=spec.model.name, to=decision.tier, outcome="started").inc()
    await _apply(ctx, obj, patch | {"move": move_status(step.move), "tiering": tiering_status}, step, logger)


async def _advance(ctx: Context, obj: dict[str, Any], spec: types.InferenceModelSpec, state: TierState,
                   facts: PoolFacts, logger: logging.Logger | logging.LoggerAdapter, now_s: float) -> None:
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    move = state.move
    assert move is not None
    refusal = facts.refusal
    if move.to == POOL and move.phase == tier_moves.LOADING and not facts.loaded and refusal is None:
        if facts.asleep:
            await wake_pool(ctx, namespace, spec.pool or "")
        refusal = await preload(facts.pods, spec.model.name)
    deployment = await ctx.kube.get("apps/v1", "deployments", namespace, name)
    pods = await ctx.kube.list("v1", "pods", namespace, pod_selector_string(name)) if deployment else []
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")] if move.to == DEDICATED else pods
    seen = tier_moves.Seen(_ready(deployment), len(live), facts.loaded, refusal)
    step = tier_moves.advance(state.tier, move, seen, now_s, tiering_spec(spec).timings())
    if step.move == move and step.tier == state.tier:
        return  # waiting within the phase
    patch: dict[str, Any] = {"tier": step.tier, "move": move_status(step.move)}
    if step.move is None:  # done, or rolled back: the minimum stay counts from now either way
        patch["tierSince"] = rfc3339.format_time(now_s)
        outcome = "rolled_back" if step.degraded else "done"
        metrics.TIER_MOVES.labels(namespace=namespace, model=spec.model.name, to=move.to, outcome=outcome).inc()
    if step.degraded is not None and step.event is not None:
        tiering = dict((obj.get("status") or {}).get("tiering") or {})
        patch["tiering"] = tiering | {"degraded": {"reason": step.degraded, "message": step.event[1]}}
    await _apply(ctx, obj, patch, step, logger)


async def _apply(ctx: Context, obj: dict[str, Any], patch: dict[str, Any], step: tier_moves.Step,
                 logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Write the phase to status, tell the story in an Event, then bring the children and the pool to it."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    await _write(ctx, namespace, name, patch)
    if step.event is not None:
        reason, message = step.event
        logger.info(f"tiering: {reason}: {message}")
        await post_event(ctx.kube, object_ref(namespace, name, meta["uid"]),
                         "Warning" if step.degraded else "Normal", reason, message)
    fresh = await ctx.kube.get(types.API_VERSION, types.PLURAL, namespace, name)
    if fresh is not None:
        await reconcile(ctx, fresh, logger)
        await sync_pools(ctx, namespace, {(fresh.get("spec") or {}).get("pool")}, logger)


async def _write(ctx: Context, namespace: str, name: str, patch: dict[str, Any]) -> None:
    async def compute(current: dict[str, Any]) -> dict[str, Any] | None:
        status = current.get("status") or {}
        changed = {k: v for k, v in patch.items() if status.get(k) != v}
        return changed or None

    await write_status(ctx.kube, namespace, name, compute)
