"""Status policy: observed facts (the Deployment, problems found) in, the status fields we own out.

The operator owns phase, message, replicas, readyReplicas, desiredReplicas, observedGeneration, endpoint,
selector and the Ready, Progressing and Degraded conditions. Every other condition (ScalingActive)
and `status.autoscaler` belong to the autoscaler and pass through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OWNED_CONDITIONS = ("Ready", "Progressing", "Degraded", "Deprecated")
MESSAGE_COLUMN_CHARS = 100  # status.message is a printer column: the whole story is in the Degraded condition


@dataclass(frozen=True)
class Problem:
    """A reason the spec, though valid, cannot be honoured (e.g. a missing PVC)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    generation: int
    desired_replicas: int
    deployment: dict[str, Any] | None  # None: not created (yet)
    problems: tuple[Problem, ...] = ()
    previous_status: dict[str, Any] | None = None
    pod_problem: Problem | None = None  # why pods fail (pod_health.summarize), found on every write
    deprecations: tuple[str, ...] = ()  # deprecated fields the spec uses (deprecations.py)


def _deployment_counts(deployment: dict[str, Any] | None) -> tuple[int, int, int, bool]:
    """(replicas, ready, updated, rolled_out) as the Deployment controller reports them."""
    if deployment is None:
        return 0, 0, 0, False
    status = deployment.get("status") or {}
    generation = deployment.get("metadata", {}).get("generation", 0)
    observed = status.get("observedGeneration", 0) >= generation
    return status.get("replicas", 0), status.get("readyReplicas", 0), status.get("updatedReplicas", 0), observed


def _condition(type_: str, ok: bool, reason: str, message: str, previous: dict[str, dict[str, Any]],
               generation: int, now: str) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = previous.get(type_)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") else now
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since, "observedGeneration": generation}


def compute_status(observed: Observed, endpoint: str, selector: str, now: str) -> dict[str, Any]:
    """The operator's part of `status`, conditions merged with the ones others own."""
    previous_status = observed.previous_status or {}
    previous_conditions = {c.get("type"): c for c in previous_status.get("conditions") or []}
    desired = observed.desired_replicas
    replicas, ready, updated, rolled_out = _deployment_counts(observed.deployment)
    was_serving = previous_status.get("phase") in ("Ready", "Degraded") and (previous_status.get("readyReplicas") or 0) > 0
    lost = was_serving and rolled_out and updated >= desired and ready < min(desired, previous_status.get("readyReplicas") or 0)

    if observed.problems:
        phase = "Degraded"
        degraded = (True, observed.problems[0].reason, "; ".join(p.message for p in observed.problems))
    elif observed.pod_problem is not None and desired > 0:
        phase = "Degraded"
        degraded = (True, observed.pod_problem.reason, observed.pod_problem.message)
    elif lost or (was_serving and previous_status.get("phase") == "Degraded" and ready < desired and rolled_out):
        phase = "Degraded"
        degraded = (True, "ReplicasLost", f"{ready} of {desired} replicas are ready; the others stopped passing readiness")
    elif desired == 0:
        phase = "ScaledToZero" if replicas == 0 else "Progressing"
        degraded = (False, "AsExpected", "")
    elif observed.deployment is None:
        phase = "Pending"
        degraded = (False, "AsExpected", "")
    elif ready >= desired and updated >= desired and rolled_out and replicas == desired:
        phase = "Ready"
        degraded = (False, "AsExpected", "")
    else:
        phase = "Progressing"
        degraded = (False, "AsExpected", "")

    if desired == 0:
        ready_condition = (False, "ScaledToZero", "scaled to zero; the next request waits for a replica to start")
    elif ready >= desired and ready > 0:
        ready_condition = (True, "AllReplicasReady", f"{ready} of {desired} replicas are ready")
    else:
        ready_condition = (False, "ReplicasNotReady", f"{ready} of {desired} replicas are ready")
    if observed.deployment is not None and (not rolled_out or updated < desired):
        progressing = (True, "RollingOut", f"{updated} of {desired} replicas run the current spec")
    elif observed.deployment is not None and (replicas != desired or ready < desired) and not degraded[0]:
        progressing = (True, "Scaling", f"{replicas} replicas exist, {ready} ready, {desired} desired")
    else:
        progressing = (False, "Complete", "")

    message = degraded[2] if degraded[0] else ready_condition[2]
    generation, before = observed.generation, previous_conditions
    owned = [
        _condition("Ready", *ready_condition, before, generation, now),
        _condition("Progressing", *progressing, before, generation, now),
        _condition("Degraded", *degraded, before, generation, now),
    ]
    if observed.deprecations or "Deprecated" in before:  # shown only to objects that ever used one
        deprecated = (True, "DeprecatedField", "; ".join(observed.deprecations)) if observed.deprecations else (
            False, "AsExpected", "")
        owned.append(_condition("Deprecated", *deprecated, before, generation, now))
    others = [c for c in previous_status.get("conditions") or [] if c.get("type") not in OWNED_CONDITIONS]
    return {
        "phase": phase,
        "message": short_message(message),
        "replicas": replicas,
        "readyReplicas": ready,
        "desiredReplicas": desired,
        "observedGeneration": generation,
        "endpoint": endpoint,
        "selector": selector,
        "conditions": owned + others,
    }


def short_message(message: str, max_chars: int = MESSAGE_COLUMN_CHARS) -> str:
    """The first clause of `message`, cut to fit the `kubectl get` column."""
    first = message.split("; ")[0]
    return first if len(first) <= max_chars else first[:max_chars - 1] + "…"


def status_changed(previous: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether writing `new` would change anything (status is written only when it changed)."""
    previous = previous or {}
    return any(previous.get(key) != value for key, value in new.items())
