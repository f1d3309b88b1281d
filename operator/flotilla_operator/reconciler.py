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
from dataclasses import dataclass, field
from typing import Any

import pydantic

from flotilla_operator import metrics, rfc3339, types
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
from flotilla_operator.plan import plan
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.status import Observed, Problem, compute_status, status_changed
from flotilla_operator.status_writer import write_status as write_model_status

PRUNABLE_KINDS = (("policy/v1", "PodDisruptionBudget"),)  # the only child a spec change can make unwanted
NOT_PROBLEMS = ("AsExpected", "ReplicasLost")  # Degraded reasons that come from observation, not from the spec
NAME_CONFLICT = "ModelNameConflict"  # Degraded, but its pods still run: its own Service still reaches them
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


def name_holder(served_name: str, models: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The InferenceModel that keeps a served name when several serve it: the oldest live one (by
    creationTimestamp, then namespace, then name), as flotilla-gateway routes (docs/gateway.md, "Route map")."""
    live = [m for m in models if not m["metadata"].get("deletionTimestamp")
            and ((m.get("spec") or {}).get("model") or {}).get("name") == served_name]
    return min(live, key=lambda m: (m["metadata"].get("creationTimestamp", ""), m["metadata"].get("namespace", ""),
                                    m["metadata"]["name"]), default=None)


async def find_problems(kube: KubeClient, namespace: str, spec: types.InferenceModelSpec,
                        meta: dict[str, Any] | None = None) -> list[Problem]:
    """Reasons a schema-valid spec cannot be honoured in this cluster right now."""
    problems = []
    if meta is not None:
        try:
            models = await kube.list(types.API_VERSION, types.PLURAL, None, "")
        except KubeError as error:
            if error.status != 403:
                raise
            models = await kube.list(types.API_VERSION, types.PLURAL, namespace, "")  # namespaced RBAC only
        holder = name_holder(spec.model.name, models)
        if holder is not None and holder["metadata"].get("uid") != meta.get("uid"):
            other = f'{holder["metadata"].get("namespace")}/{holder["metadata"]["name"]}'
            problems.append(Problem(
                NAME_CONFLICT,
                f'the model name "{spec.model.name}" is already served by the older InferenceModel {other}, '
                "and the gateway routes it there; change spec.model.name",
            ))
    pvc = spec.model.source.pvc
    if pvc is not None and await kube.get("v1", "persistentvolumeclaims", namespace, pvc.claim_name) is None:
        problems.append(Problem(
            "ClaimNotFound",
            f'PersistentVolumeClaim "{pvc.claim_name}" does not exist in namespace "{namespace}"; '
            "create it, or change spec.model.source.pvc.claimName",
        ))
    return problems


async def reconcile(ctx: Context, body: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Bring one InferenceModel's children and status to the desired state."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
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
    problems = await find_problems(ctx.kube, namespace, spec, meta)
    desired = desired_children(owner, ctx.settings.default_image, ctx.monitoring)
    if any(p.reason != NAME_CONFLICT for p in problems):  # pods that cannot start are not created
        desired = [child for child in desired if child["kind"] != "Deployment"]
    observed = await observe(ctx.kube, namespace, name, desired, PRUNABLE_KINDS)
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
                       applied_generation: int | None = None) -> dict[str, Any] | None:
    """Recompute and write our status fields; `problems` None keeps the last reconcile's findings.

    `applied_generation` is the spec generation just applied; None (a Deployment event) keeps the
    last one recorded, so observedGeneration never claims a spec that was not reconciled yet.

    Returns the status as it was before (status_writer.write_status: one read-compute-write, retried on conflict).
    """
    async def compute(obj: dict[str, Any]) -> dict[str, Any] | None:
        previous = obj.get("status") or {}
        try:
            spec = types.parse_spec(obj.get("spec") or {})
            desired, max_replicas, served_name = desired_replicas(spec), spec.scaling.max_replicas, spec.model.name
            deprecated = tuple(deprecations(spec))
        except pydantic.ValidationError:
            desired, max_replicas = int((obj.get("spec") or {}).get("replicas") or 0), 0
            served_name, deprecated = name, ()
        deployment = await ctx.kube.get("apps/v1", "deployments", namespace, name)
        generation = applied_generation or previous.get("observedGeneration") or obj["metadata"].get("generation", 1)
        observed = Observed(
            generation=generation,
            desired_replicas=desired,
            deployment=deployment,
            problems=tuple(_known_problems(previous) if problems is None else problems),
            previous_status=previous,
            deprecations=deprecated,
        )
        new = compute_status(observed, endpoint(name, namespace), pod_selector_string(name), rfc3339.now())
        # label `model` is the served name, as on the servers' own metrics, so dashboards can join them
        metrics.DESIRED_REPLICAS.labels(namespace=namespace, model=served_name).set(desired)
        metrics.READY_REPLICAS.labels(namespace=namespace, model=served_name).set(new["readyReplicas"])
        metrics.MAX_REPLICAS.labels(namespace=namespace, model=served_name).set(max_replicas)
        return new if status_changed(previous, new) else None

    return await write_model_status(ctx.kube, namespace, name, compute)


def forget(namespace: str, served_name: str) -> None:
    """Drop the gauges of a deleted model."""
    for gauge in (metrics.DESIRED_REPLICAS, metrics.READY_REPLICAS, metrics.MAX_REPLICAS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, served_name)
