"""How the autoscaler's memory is written to and read from `status.autoscaler`.

The recommendation history lives in the InferenceModel's status, not in the operator's process, so
that a restart neither forgets a scale-down window (and collapses the fleet) nor freezes it
(KubeAI #383). Times are RFC 3339 strings, as everywhere in the Kubernetes API. `woken_at` reads the stamp
a gateway leaves on what it woke from zero (an InferenceModel or a ModelPool).
"""

from __future__ import annotations

from typing import Any

from flotilla_contract.labels import WOKEN_AT_ANNOTATION

from flotilla_operator.autoscaler import AutoscalerState, Decision, Recommendation
from flotilla_operator.rfc3339 import format_time, parse_time


def read_recommendations(entries: Any) -> tuple[Recommendation, ...]:
    """A status list of {time, replicas}, oldest first; entries that cannot be read are dropped rather than
    failing the loop (the SLO scaler's memory, slo_status.py, keeps its list the same way)."""
    recommendations = []
    for entry in entries or []:
        try:
            recommendations.append(Recommendation(parse_time(entry["time"]), int(entry["replicas"])))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(sorted(recommendations, key=lambda r: r.time_s))


def written_recommendations(recommendations: tuple[Recommendation, ...]) -> list[dict[str, Any]]:
    return [{"time": format_time(r.time_s), "replicas": r.replicas} for r in recommendations]


def state_from_status(autoscaler_status: dict[str, Any] | None) -> AutoscalerState:
    """The remembered state; entries that cannot be read are dropped rather than failing the loop."""
    status = autoscaler_status or {}
    idle_since_s = None
    if status.get("idleSince"):
        try:
            idle_since_s = parse_time(status["idleSince"])
        except (TypeError, ValueError):
            idle_since_s = None
    return AutoscalerState(read_recommendations(status.get("recommendations")), idle_since_s)


def status_patch(
    decision: Decision, current_replicas: int, waiting: float | None, now_s: float, last_scale_time: str | None
) -> dict[str, Any]:
    """The `status.autoscaler` object after `decision`; lastScaleTime moves only when replicas change."""
    state = decision.state
    changed = decision.desired_replicas != current_replicas
    return {
        "lastDecision": f"{decision.reason}: {current_replicas} -> {decision.desired_replicas}: {decision.message}",
        "lastReason": decision.reason,
        "lastScaleTime": format_time(now_s) if changed else last_scale_time,
        "queueDepth": round(waiting) if waiting is not None else None,
        "recommendations": written_recommendations(state.recommendations),
        "idleSince": format_time(state.idle_since_s) if state.idle_since_s is not None else None,
    }


SCALING_ACTIVE = "ScalingActive"
VALID_METRIC_FOUND = "ValidMetricFound"
SCALING_DISABLED = "ScalingDisabled"


def scaling_condition(
    conditions: list[dict[str, Any]] | None, ok: bool, reason: str, message: str, now: str, generation: int
) -> list[dict[str, Any]]:
    """`conditions` with ScalingActive set; the others (owned by the reconciler) pass through untouched."""
    status = "True" if ok else "False"
    others, old = [], None
    for condition in conditions or []:
        if condition.get("type") == SCALING_ACTIVE:
            old = condition
        else:
            others.append(condition)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") else now
    return [*others, {"type": SCALING_ACTIVE, "status": status, "reason": reason, "message": message,
                      "lastTransitionTime": since, "observedGeneration": generation}]


def scaling_active(conditions: list[dict[str, Any]] | None) -> bool | None:
    """Whether ScalingActive is True; None when it was never set."""
    for condition in conditions or []:
        if condition.get("type") == SCALING_ACTIVE:
            return condition.get("status") == "True"
    return None


def starting_replicas(current_replicas: int, deployment: dict[str, Any] | None) -> int:
    """Replicas asked for but not ready: capacity to come, unless the Deployment gave up on them."""
    if deployment is None:
        return current_replicas
    status = deployment.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return 0  # stuck pods are not coming: let the autoscaler act on demand again
    return max(current_replicas - int(status.get("readyReplicas") or 0), 0)  # pods not yet created count too


def woken_at(obj: dict[str, Any]) -> float | None:
    """When flotilla-gateway last woke the object from zero, from its annotation; None if never or unreadable."""
    text = (obj["metadata"].get("annotations") or {}).get(WOKEN_AT_ANNOTATION)
    try:
        return parse_time(text) if text else None
    except ValueError:
        return None
