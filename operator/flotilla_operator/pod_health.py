"""Pod failure policy: why a model's pods are not serving, from the pods as the kubelet reports them.

A pod stuck in ImagePullBackOff or Unschedulable leaves the Deployment "progressing" forever; without
this the InferenceModel would say Pending with no reason. `pod_failure()` reads one pod, `summarize()`
aggregates a model's pods into one `Problem` for the Degraded condition (docs/operator.md, "Status").
Pure: the caller lists the pods and supplies the clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flotilla_operator.status import Problem

UNSCHEDULABLE_GRACE_S = 120.0  # a node autoscaler adding a GPU node takes minutes: unschedulable is normal that long
MAX_MESSAGE_CHARS = 300
# A reason earlier in this order wins for the condition when counts tie; it is also more specific.
REASONS = ("OOMKilled", "CreateContainerConfigError", "ImagePullBackOff", "Unschedulable",
           "StartupProbeFailing", "CrashLoopBackOff")
# kubelet waiting reasons → the reason shown, with what to change.
WAITING = {
    "ImagePullBackOff": ("ImagePullBackOff", "check spec.image (or the operator's --default-image) and the registry's pull secret"),
    "ErrImagePull": ("ImagePullBackOff", "check spec.image (or the operator's --default-image) and the registry's pull secret"),
    "InvalidImageName": ("ImagePullBackOff", "fix spec.image"),
    "CreateContainerConfigError": ("CreateContainerConfigError",
                                   "create the missing Secret or key, or fix the reference in the spec (tokenSecret, server.apiKeySecretRef)"),
    "CreateContainerError": ("CreateContainerConfigError", "fix the container settings the kubelet names"),
    "CrashLoopBackOff": ("CrashLoopBackOff", "see why with kubectl logs --previous on the pod"),
    "RunContainerError": ("CrashLoopBackOff", "see why with kubectl describe on the pod"),
}
OOM_ADVICE = "raise spec.resources.memory, or lower spec.server.kvCacheMemoryFraction or spec.server.maxNumSeqs"


@dataclass(frozen=True)
class PodFailure:
    pod: str
    reason: str  # one of REASONS
    message: str  # the kubelet's or scheduler's words, then what to change


def _seconds_since(rfc3339: str | None, now_s: float) -> float:
    if not rfc3339:
        return 0.0
    return now_s - datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _startup_budget_s(pod: Mapping[str, Any], container: str) -> float | None:
    """initialDelay + failureThreshold × period of the container's startup probe (None: it has none)."""
    for spec in (pod.get("spec") or {}).get("containers") or []:
        probe = spec.get("startupProbe") if spec.get("name") == container else None
        if probe:
            return (probe.get("initialDelaySeconds", 0)
                    + probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10))
    return None


def _container_failure(pod: Mapping[str, Any], status: Mapping[str, Any], now_s: float) -> tuple[str, str] | None:
    name = status.get("name", "?")
    state, last = status.get("state") or {}, status.get("lastState") or {}
    for terminated in (state.get("terminated"), last.get("terminated")):  # an OOM kill explains the back-off after it
        if terminated and terminated.get("reason") == "OOMKilled":
            return "OOMKilled", f"container {name} was killed for using more memory than its limit; {OOM_ADVICE}"
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in WAITING:
        reason, advice = WAITING[waiting["reason"]]
        detail = waiting.get("message") or waiting["reason"]
        return reason, f"container {name}: {detail}; {advice}"
    running = state.get("running")
    budget_s = _startup_budget_s(pod, name)
    if running and status.get("started") is False and budget_s is not None:
        up_s = _seconds_since(running.get("startedAt"), now_s)
        if up_s > budget_s:
            return "StartupProbeFailing", (
                f"container {name} has not passed its startup probe within {budget_s:.0f}s; "
                "see why in its logs (a model on slow storage loads slower than the probe allows)")
    return None


def pod_failure(pod: Mapping[str, Any], now_s: float, unschedulable_grace_s: float = UNSCHEDULABLE_GRACE_S) -> PodFailure | None:
    """The one reason this pod is not serving, or None when it is fine or still starting normally."""
    name = pod.get("metadata", {}).get("name", "?")
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return None  # going away: its state no longer describes the model
    status = pod.get("status") or {}
    found = [f for s in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
             if (f := _container_failure(pod, s, now_s)) is not None]
    if found:
        reason, message = min(found, key=lambda f: REASONS.index(f[0]))  # the more specific of several containers'
        return PodFailure(name, reason, message)
    for condition in status.get("conditions") or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
                and _seconds_since(condition.get("lastTransitionTime"), now_s) >= unschedulable_grace_s):
            words = condition.get("message") or "no node fits the pod"
            return PodFailure(name, "Unschedulable", f"{words}; add a node that fits (GPUs, memory), "
                              "or lower spec.resources or relax spec.placement")
    return None


def summarize(pods: Iterable[Mapping[str, Any]], now_s: float,
              unschedulable_grace_s: float = UNSCHEDULABLE_GRACE_S) -> Problem | None:
    """One Problem for all of a model's pods: the commonest reason, as `2/4 pods: ImagePullBackOff (pod): …`."""
    pods = list(pods)
    failures = [f for pod in pods if (f := pod_failure(pod, now_s, unschedulable_grace_s)) is not None]
    if not failures:
        return None
    counts = Counter(f.reason for f in failures)
    ranked = sorted(counts, key=lambda reason: (-counts[reason], REASONS.index(reason)))
    parts = []
    for reason in ranked:
        first = next(f for f in failures if f.reason == reason)
        parts.append(f"{counts[reason]}/{len(pods)} pods: {reason} ({first.pod}): {first.message}")
    message = "; ".join(parts)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 1] + "…"
    return Problem(ranked[0], message)
