"""The reconcile loop body: gather facts, plan, apply the plan, write the status we own.

Every entry point (create, update, resume, the drift timer, child Deployment events) lands here,
so they all converge on the same state. Decisions live in pure modules (manifests, plan.plan,
status.compute_status); this module only sequences API calls around them (docs/architecture.md,
"Control plane").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from flotilla_operator import adapter_status, metrics, pod_health, rfc3339, types
from flotilla_operator.adapters import adapter_claims
from flotilla_operator.adaptive_manifests import ADAPTIVE_PRUNABLE_KINDS, adaptive_children
from flotilla_operator.apply import execute, observe
from flotilla_operator.deprecations import deprecations
from flotilla_operator.events import object_ref, post_event
from flotilla_operator.kube import KubeClient, KubeError
from flotilla_operator.manifests import (
    Owner,
    desired_children,
    desired_replicas,
    endpoint,
    pod_selector_string,
)
from flotilla_operator.placement import ADAPTIVE
from flotilla_operator.plan import plan
from flotilla_operator.pool_join import member_children, pool_serving
from flotilla_operator.pool_members import joins_pool
from flotilla_operator.pool_residency import read_loads
from flotilla_operator.served_names import NAME_CONFLICT, holders, name_conflict
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.status import Observed, Problem, compute_status, status_changed
from flotilla_operator.status_writer import write_status as write_model_status
from flotilla_operator.tier_moves import DRAINING
from flotilla_operator.tier_state import model_children, read_state

# the children a spec change can make unwanted (cost-first drops the PDB; networkPolicy.enabled: false its policy;
# removing the last adapter the adapter list ConfigMap)
PRUNABLE_KINDS = (("policy/v1", "PodDisruptionBudget"), ("networking.k8s.io/v1", "NetworkPolicy"), ("v1", "ConfigMap"))
# Degraded reasons that come from observation, not from the spec: recomputed on every write, never carried
NOT_PROBLEMS = ("AsExpected", "ReplicasLost", adapter_status.ADAPTER_REFUSED, *pod_health.REASONS)
PAST_TENSE = {"create": "Created", "update": "Updated", "delete": "Deleted"}


@dataclass
class Context:
    """What handlers share, kept in kopf's memo: settings, the API client, one lock per model."""

    settings: OperatorSettings
    kube: KubeClient
    monitoring: bool
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self.locks.setdefault((namespace, name), asyncio.Lock())


async def list_claimants(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    """Every InferenceModel that may claim a served name: cluster-wide, as the gateway sees them, or only
    `namespace`'s where the operator's RBAC is namespaced."""
    try:
        return await kube.list(types.API_VERSION, types.PLURAL, None, "")
    except KubeError as error:
        if error.status != 403:
            raise
        return await kube.list(types.API_VERSION, types.PLURAL, namespace, "")


async def read_model(kube: KubeClient, namespace: str, name: str
                     ) -> tuple[dict[str, Any], types.InferenceModelSpec] | None:
    """The stored InferenceModel and its typed spec, for a timer's tick; None when it is gone, being deleted, or
    its spec cannot be read (its reconcile reports that as Degraded InvalidSpec)."""
    obj = await kube.get(types.API_VERSION, types.PLURAL, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    try:
        return obj, types.parse_spec(obj.get("spec") or {})
    except pydantic.ValidationError:
        return None


async def find_problems(kube: KubeClient, namespace: str, spec: types.InferenceModelSpec) -> list[Problem]:
    """Reasons a schema-valid spec of a dedicated model cannot be honoured in this cluster right now."""
    problems = []
    pvc = spec.model.source.pvc
    if pvc is not None and await kube.get("v1", "persistentvolumeclaims", namespace, pvc.claim_name) is None:
        problems.append(Problem(
            "ClaimNotFound",
            f'PersistentVolumeClaim "{pvc.claim_name}" does not exist in namespace "{namespace}"; '
            "create it, or change spec.model.source.pvc.claimName",
        ))
    for claim in adapter_claims(spec.adapters):
        if await kube.get("v1", "persistentvolumeclaims", namespace, claim) is None:
            users = ", ".join(a.name for a in spec.adapters if a.source.pvc and a.source.pvc.claim_name == claim)
            problems.append(Problem(
                "ClaimNotFound",
                f'PersistentVolumeClaim "{claim}" of adapter {users} does not exist in namespace "{namespace}"; '
                "create it, or change the adapter's source.pvc.claimName",
            ))
    return problems


async def reconcile(ctx: Context, body: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Bring one InferenceModel's children and status to the desired state."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    if meta.get("deletionTimestamp"):
        return  # being deleted: children made now would outlive it until the garbage collector runs
    ref = object_ref(namespace, name, uid)
    metrics.RECONCILES.labels(resource="inferencemodel").inc()
    try:
        spec = types.parse_spec(body.get("spec") or {})
    except pydantic.ValidationError as error:
        problem = Problem("InvalidSpec", f"the spec cannot be read: {error.errors()[0]['msg']} at "
                          f"{'.'.join(map(str, error.errors()[0]['loc']))}; fix it and re-apply")
        await write_status(ctx, namespace, name, [problem], meta.get("generation"))
        return
    owner = Owner(name, namespace, uid, spec)
    conflict = name_conflict(spec.model.name, uid, holders(await list_claimants(ctx.kube, namespace)))
    status = body.get("status") or {}
    if spec.placement.policy == ADAPTIVE:  # in its pool, on its own replicas, or moving between them (tier_state.py)
        desired, prunable, problems = await _adaptive_children(ctx, owner, status, conflict)
    elif joins_pool(spec):  # a cost-first member of a ModelPool: no Deployment of its own (pool_join.py)
        desired, prunable, problems = await member_children(ctx.kube, owner, ctx.settings.default_image, conflict)
    else:
        problems = [*([conflict] if conflict else []), *await find_problems(ctx.kube, namespace, spec)]
        desired = desired_children(owner, ctx.settings.default_image, ctx.monitoring)
        # pods that cannot start are not created; a conflicted model's still run, reached by its own Service only
        if any(p.reason != NAME_CONFLICT for p in problems):
            desired = [child for child in desired if child["kind"] != "Deployment"]
        prunable = PRUNABLE_KINDS
    observed = await observe(ctx.kube, namespace, name, desired, prunable)
    the_plan = plan(desired, observed, uid)
    outcome = await execute(ctx.kube, the_plan)
    for action, error in outcome.refused:
        problems.append(Problem("ChildRejected", f"the API server refused {action.kind} {action.name}: {error.message}"))
    for action in outcome.done:
        verb = PAST_TENSE[action.verb]
        logger.info(f"{verb.lower()} {action.kind} {namespace}/{action.name}: {action.reason}")
        await post_event(ctx.kube, ref, "Normal", verb, f"{verb} {action.kind} {action.name}: {action.reason}")
    previous = await write_status(ctx, namespace, name, problems, meta.get("generation"))
    old_messages = _problem_messages(previous)
    for problem in problems:
        if problem.message not in old_messages:
            logger.info(f"cannot honour the spec: {problem.message}")
            await post_event(ctx.kube, ref, "Warning", problem.reason, problem.message)
    old_deprecations = _condition_message(previous, "Deprecated")
    for message in deprecations(spec):  # once per object: the Deprecated condition remembers it
        if message not in old_deprecations:
            logger.info(message)
            await post_event(ctx.kube, ref, "Warning", "DeprecatedField", message)


async def _adaptive_children(ctx: Context, owner: Owner, status: dict[str, Any], conflict: Problem | None
                             ) -> tuple[list[dict[str, Any]], tuple[tuple[str, str], ...], list[Problem]]:
    """(desired children, prunable kinds, problems) of an adaptive model: its tier's children, the problems of
    both tiers it has children in, and the Degraded reason of a move that was rolled back (status.tiering)."""
    spec = owner.spec
    tier = model_children(spec, status, desired_replicas(spec))
    own_problems = await find_problems(ctx.kube, owner.namespace, spec)  # its dedicated pods could not start
    problems = [*([conflict] if conflict else []), *own_problems]
    if tier.pool_member:  # the tiering handler moves a model its pool cannot take to dedicated replicas
        problems += (await member_children(ctx.kube, owner, ctx.settings.default_image, None))[2]
    rolled_back = (status.get("tiering") or {}).get("degraded")
    if isinstance(rolled_back, dict) and rolled_back.get("reason"):
        problems.append(Problem(rolled_back["reason"], rolled_back.get("message", "")))
    move = read_state(status).move
    draining = move is not None and move.phase == DRAINING and move.to == "pool"
    desired = adaptive_children(owner, ctx.settings.default_image, ctx.monitoring, tier, keep_deployment=draining)
    if own_problems:
        desired = [child for child in desired if child["kind"] != "Deployment"]
    return desired, ADAPTIVE_PRUNABLE_KINDS, problems


def _condition_message(status: dict[str, Any] | None, type_: str) -> str:
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return condition.get("message", "")
    return ""


def _problem_messages(status: dict[str, Any] | None) -> str:
    return _condition_message(status, "Degraded")


def _known_problems(status: dict[str, Any] | None) -> list[Problem]:
    """Problems found by the last full reconcile, as its Degraded condition recorded them."""
    for condition in (status or {}).get("conditions") or []:
        if (condition.get("type") == "Degraded" and condition.get("status") == "True"
                and condition.get("reason") not in NOT_PROBLEMS):
            return [Problem(condition["reason"], condition.get("message", ""))]
    return []


async def write_status(ctx: Context, namespace: str, name: str, problems: list[Problem] | None,
                       applied_generation: int | None = None,
                       resident_pods: list[str] | None = None,
                       adapter_pods: Mapping[str, adapter_status.PodAdapters | None] | None = None,
                       ) -> dict[str, Any] | None:
    """Recompute and write our status fields; `problems` None keeps the last reconcile's findings.

    `applied_generation` is the spec generation just applied; None (a Deployment event) keeps the
    last one recorded, so observedGeneration never claims a spec that was not reconciled yet.
    `resident_pods` (a pooled model's pods holding it, from its pool's pass) None keeps the last figure.
    `adapter_pods` (each pool pod's adapters, from its pool's pass) likewise for a pooled model's
    status.adapters and its AdapterRefused problem; a dedicated model's pods are asked here, when it has adapters.

    Returns the status as it was before (status_writer.write_status: one read-compute-write, retried on conflict).
    A pod problem that is new (its reason differs from the last Degraded reason) gets one Warning Event.
    """
    written: dict[str, Any] = {}
    uid = ""

    async def compute(obj: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal uid
        uid = obj["metadata"]["uid"]
        previous = obj.get("status") or {}
        try:
            spec = types.parse_spec(obj.get("spec") or {})
            desired, max_replicas, served_name = desired_replicas(spec), spec.scaling.max_replicas, spec.model.name
            pool_name = spec.pool if model_children(spec, previous, 0).routed_to_pool else None
            deprecated = tuple(deprecations(spec))
            adapter_names = [adapter.name for adapter in spec.adapters]
        except pydantic.ValidationError:
            desired, max_replicas = int((obj.get("spec") or {}).get("replicas") or 0), 0
            served_name, pool_name, deprecated, adapter_names = name, None, (), []
        known = tuple(_known_problems(previous) if problems is None else problems)
        if any(p.reason == NAME_CONFLICT for p in known):
            pool_name = None  # a member whose served name another holds does not join (pool_join.member_children)
        serving = await pool_serving(ctx.kube, spec, namespace) if pool_name is not None else None
        pods: list[dict[str, Any]] = []  # a member's pods are the pool's: their failures show on the ModelPool
        if serving is not None:  # a member reports the pool's pods: its own replicas do not apply
            desired, deployment = serving
        else:
            pool_name = None  # not (or not yet) a member
            deployment = await ctx.kube.get("apps/v1", "deployments", namespace, name)
            pods = await ctx.kube.list("v1", "pods", namespace, pod_selector_string(name)) if deployment else []
        adapters = await _adapter_findings(adapter_names, served_name, pool_name, pods, adapter_pods, previous)
        if adapters.problem is not None:
            known = (*known, adapters.problem)
        generation = applied_generation or previous.get("observedGeneration") or obj["metadata"].get("generation", 1)
        observed = Observed(
            generation=generation,
            desired_replicas=desired,
            deployment=deployment,
            problems=known,
            previous_status=previous,
            pod_problem=pod_health.summarize(pods, time.time()),
            deprecations=deprecated,
        )
        new = compute_status(observed, endpoint(name, namespace), pod_selector_string(name), rfc3339.now())
        if pool_name is not None or previous.get("pool"):
            new["pool"] = pool_name  # None on leaving: the merge patch removes it
            if pool_name is None:
                new["residentPods"] = None
            elif resident_pods is not None:  # only a pool pass knows; other writers keep the last figure
                new["residentPods"] = resident_pods
        if adapter_names:
            new["adapters"] = adapters.counts
        elif previous.get("adapters"):
            new["adapters"] = None  # the last adapter removed: the merge patch removes the field
        # label `model` is the served name, as on the servers' own metrics, so dashboards can join them
        metrics.DESIRED_REPLICAS.labels(namespace=namespace, model=served_name).set(desired)
        metrics.READY_REPLICAS.labels(namespace=namespace, model=served_name).set(new["readyReplicas"])
        metrics.MAX_REPLICAS.labels(namespace=namespace, model=served_name).set(max_replicas)
        written.clear()
        written.update(new)
        return new if status_changed(previous, new) else None

    previous = await write_model_status(ctx.kube, namespace, name, compute)
    if previous is not None:
        await _announce_pod_problem(ctx, object_ref(namespace, name, uid), previous, written)
    return previous


@dataclass(frozen=True)
class AdapterFindings:
    counts: list[dict[str, Any]]  # status.adapters
    problem: Problem | None  # AdapterRefused, or None


async def _adapter_findings(names: list[str], served_name: str, pool_name: str | None, pods: list[dict[str, Any]],
                            adapter_pods: Mapping[str, adapter_status.PodAdapters | None] | None,
                            previous: dict[str, Any]) -> AdapterFindings:
    """status.adapters and the AdapterRefused problem (adapter_status.py). A dedicated model's pods are asked for
    their load reports here; a pooled model's come from its pool's pass (`adapter_pods`), and a write without
    them keeps the last figures and the last AdapterRefused condition."""
    if not names:
        return AdapterFindings([], None)
    if pool_name is None:
        adapter_pods = adapter_status.pods_adapters(await read_loads(pods)) if pods else {}
    if adapter_pods is None:
        degraded = _degraded(previous)
        kept = Problem(*degraded) if degraded and degraded[0] == adapter_status.ADAPTER_REFUSED else None
        counts = {c.get("name"): c for c in previous.get("adapters") or []}
        return AdapterFindings([counts.get(n) or {"name": n, "pods": 0, "resident": 0} for n in names], kept)
    return AdapterFindings(adapter_status.adapter_counts(names, adapter_pods),
                           adapter_status.refused_problem(names, served_name, adapter_pods))


def _degraded(status: dict[str, Any] | None) -> tuple[str, str] | None:
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == "Degraded" and condition.get("status") == "True":
            return condition.get("reason", ""), condition.get("message", "")
    return None


async def _announce_pod_problem(ctx: Context, ref: dict[str, Any], previous: dict[str, Any],
                                new: dict[str, Any]) -> None:
    """One Warning Event when pods start failing for a new reason (not per back-off step or recount)."""
    now, before = _degraded(new), _degraded(previous)
    if now is None or now[0] not in pod_health.REASONS or (before is not None and before[0] == now[0]):
        return
    await post_event(ctx.kube, ref, "Warning", now[0], now[1])


def forget(namespace: str, served_name: str) -> None:
    """Drop the gauges of a deleted model."""
    for gauge in (metrics.DESIRED_REPLICAS, metrics.READY_REPLICAS, metrics.MAX_REPLICAS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, served_name)
