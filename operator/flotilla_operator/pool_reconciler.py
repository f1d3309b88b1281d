"""The ModelPool reconcile body: find the members, plan the pool's children, apply, write the pool's status.

Same shape as reconciler.py (docs/architecture.md, "Control plane"): decisions are pure (pool_members,
pool_manifests, plan.plan, status.compute_status); this module sequences the API calls around them.
A member joining or leaving changes the members ConfigMap only, so no pool pod restarts. Each pass also
asks the pool's pods which members they hold (pool_residency), for the pool's and the members' status.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pydantic

from flotilla_operator import metrics, pool_types, rfc3339, types
from flotilla_operator.apply import execute, observe
from flotilla_operator.events import post_event
from flotilla_operator.manifests import endpoint
from flotilla_operator.plan import plan
from flotilla_operator.pool_manifests import (
    PoolOwner,
    desired_pool_children,
    desired_pool_replicas,
    pool_deployment_name,
    pool_selector_string,
)
from flotilla_operator.pool_members import Member, adapter_claims, members
from flotilla_operator.pool_residency import Residency, read_loads, residency
from flotilla_operator.reconciler import PAST_TENSE, Context, list_claimants
from flotilla_operator.served_names import holders, name_conflict
from flotilla_operator.status import Observed, Problem, compute_status, status_changed
from flotilla_operator.status_writer import write_status

PRUNABLE_KINDS = (("policy/v1", "PodDisruptionBudget"),)  # a switch to cost-first drops the PDB


def pool_lock_key(name: str) -> str:
    """The lock name of a pool: distinct from an InferenceModel of the same name."""
    return f"{pool_types.PLURAL}/{name}"


def pool_ref(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The ModelPool an Event is about."""
    return {"apiVersion": types.API_VERSION, "kind": pool_types.KIND, "name": name, "namespace": namespace, "uid": uid}


async def list_members(ctx: Context, namespace: str, pool_name: str, spec: pool_types.ModelPoolSpec) -> list[Member]:
    """The InferenceModels of the namespace that join this pool: not being deleted, and each holding its served
    name (a pool serves a name for its holder only, the model the gateway routes it to: served_names.py)."""
    claimants = await list_claimants(ctx.kube, namespace)
    held = holders(claimants)
    models, statuses = [], {}
    for obj in claimants:
        meta = obj["metadata"]
        if meta.get("namespace") != namespace or meta.get("deletionTimestamp"):
            continue
        try:
            model_spec = types.parse_spec(obj.get("spec") or {})
        except pydantic.ValidationError:
            continue  # its own reconcile reports InvalidSpec
        if name_conflict(model_spec.model.name, meta.get("uid", ""), held) is None:  # else its own reconcile reports it
            models.append((meta["name"], model_spec))
            statuses[meta["name"]] = obj.get("status") or {}
    return members(models, pool_name, spec, statuses)


async def drop_missing_adapter_claims(ctx: Context, namespace: str, found: list[Member]
                                      ) -> tuple[list[Member], list[Problem]]:
    """The members with the adapters on missing claims left out (mounting a missing claim would keep every new
    pool pod Pending), and one AdapterClaimNotFound problem naming those claims and adapters."""
    missing = [claim for claim in adapter_claims(found)
               if await ctx.kube.get("v1", "persistentvolumeclaims", namespace, claim) is None]
    if not missing:
        return found, []
    dropped = [f"{m.name}/{a.name}" for m in found for a in m.adapters if a.claim in missing]
    kept = [replace(m, adapters=tuple(a for a in m.adapters if a.claim not in missing)) for m in found]
    claims = ", ".join(f'"{claim}"' for claim in missing)
    return kept, [Problem("AdapterClaimNotFound", f"PersistentVolumeClaim {claims} does not exist in namespace "
                          f'"{namespace}", so adapters {", ".join(dropped)} are not served; create it, or change '
                          "those adapters' source.pvc.claimName")]


async def reconcile_pool(ctx: Context, body: dict[str, Any],
                         logger: logging.Logger | logging.LoggerAdapter) -> tuple[list[Member], Residency]:
    """Bring one ModelPool's children and status to the desired state; returns its members and their residency."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    ref = pool_ref(namespace, name, uid)
    metrics.RECONCILES.labels(resource="modelpool").inc()
    try:
        spec = pool_types.parse_pool_spec(body.get("spec") or {})
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        problem = Problem("InvalidSpec", f"the spec cannot be read: {first['msg']} at "
                          f"{'.'.join(map(str, first['loc']))}; fix it and re-apply")
        await write_pool_status(ctx, namespace, name, [problem], [], Residency(), meta.get("generation"))
        return [], Residency()
    owner = PoolOwner(name, namespace, uid, spec)
    found = await list_members(ctx, namespace, name, spec)
    problems = []
    if spec.volume is not None and await ctx.kube.get("v1", "persistentvolumeclaims", namespace,
                                                      spec.volume.claim_name) is None:
        problems.append(Problem("ClaimNotFound", f'PersistentVolumeClaim "{spec.volume.claim_name}" does not exist in '
                                f'namespace "{namespace}"; create it, or change spec.volume.claimName'))
    found, adapter_problems = await drop_missing_adapter_claims(ctx, namespace, found)
    desired = desired_pool_children(owner, found, ctx.settings.default_image, ctx.monitoring)
    if problems:  # pods that cannot start are not created
        desired = [child for child in desired if child["kind"] != "Deployment"]
    problems += adapter_problems  # shown, but the pool's pods still start: those adapters are left out
    observed = await observe(ctx.kube, namespace, owner.child_name, desired, PRUNABLE_KINDS)
    outcome = await execute(ctx.kube, plan(desired, observed, uid))
    for action, error in outcome.refused:
        problems.append(Problem("ChildRejected", f"the API server refused {action.kind} {action.name}: {error.message}"))
    for action in outcome.done:
        verb = PAST_TENSE[action.verb]
        logger.info(f"{verb.lower()} {action.kind} {namespace}/{action.name}: {action.reason}")
        await post_event(ctx.kube, ref, "Normal", verb, f"{verb} {action.kind} {action.name}: {action.reason}")
    pods = await ctx.kube.list("v1", "pods", namespace, pool_selector_string(name))
    resident = residency(await read_loads(pods))
    previous = await write_pool_status(ctx, namespace, name, problems, found, resident, meta.get("generation"))
    old = _degraded_message(previous)
    for problem in problems:
        if problem.message not in old:
            await post_event(ctx.kube, ref, "Warning", problem.reason, problem.message)
    return found, resident


async def sync_pools(ctx: Context, namespace: str, pool_names: set[str | None],
                     logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Reconcile the pools a model joined or left, so their members ConfigMaps follow at once.

    Called with the model's lock held: the lock order is always model, then pool.
    """
    for pool_name in sorted(name for name in pool_names if name):
        async with ctx.lock(namespace, pool_lock_key(pool_name)):
            obj = await ctx.kube.get(types.API_VERSION, pool_types.PLURAL, namespace, pool_name)
            if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                await reconcile_pool(ctx, obj, logger)


def _degraded_message(status: dict[str, Any] | None) -> str:
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == "Degraded" and condition.get("status") == "True":
            return condition.get("message", "")
    return ""


def pool_status_fields(found: list[Member], resident: Residency) -> dict[str, Any]:
    """The membership and residency part of a pool's status."""
    return {"memberCount": len(found), "residentCount": resident.resident_count,
            "members": [{"name": m.name, "model": m.model, "source": m.source} for m in found]}


async def write_pool_status(ctx: Context, namespace: str, name: str, problems: list[Problem], found: list[Member],
                            resident: Residency, applied_generation: int | None = None) -> dict[str, Any] | None:
    """Recompute and write the pool's status."""
    async def compute(obj: dict[str, Any]) -> dict[str, Any] | None:
        previous = obj.get("status") or {}
        try:
            desired = desired_pool_replicas(pool_types.parse_pool_spec(obj.get("spec") or {}))
        except pydantic.ValidationError:
            desired = int((obj.get("spec") or {}).get("replicas") or 0)
        deployment = await ctx.kube.get("apps/v1", "deployments", namespace, pool_deployment_name(name))
        generation = applied_generation or previous.get("observedGeneration") or obj["metadata"].get("generation", 1)
        observed = Observed(generation=generation, desired_replicas=desired, deployment=deployment,
                            problems=tuple(problems), previous_status=previous)
        new = compute_status(observed, endpoint(pool_deployment_name(name), namespace), pool_selector_string(name), rfc3339.now())
        new |= pool_status_fields(found, resident)
        return new if status_changed(previous, new) else None

    return await write_status(ctx.kube, namespace, name, compute, plural=pool_types.PLURAL)
