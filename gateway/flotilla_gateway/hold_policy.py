"""What to do with a request for a known model, and how many held requests a pod can take: pure rules.

Rules (docs/gateway.md, "Scale from zero"):
- a Degraded model is refused at once with 503 and its status message, and never held;
- a draining gateway refuses with 503;
- a model with ready pods and nobody held is routed; while anyone is held, newcomers queue behind them;
- a model at zero replicas with autoscaling off is refused at once with 503: nothing will wake it;
- otherwise the request is held, unless the hold queue is full (429); the first hold of a model at
  zero replicas wakes it (a pooled model's replicas and scaling are its ModelPool's, and the pool is woken);
- held requests are released to a pod no faster than its admission queue takes them;
- whenever the route map changes, a model with held requests whose scaler is at zero is woken (again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from flotilla_contract.flags import DEFAULT_QUEUE_DEPTH_PER_SLOT

from flotilla_gateway.route_map import ModelRoute
from flotilla_gateway.routing import PodView

Action = Literal["route", "hold", "refuse"]
UNKNOWN_POD_ROOM = DEFAULT_QUEUE_DEPTH_PER_SLOT  # a pod whose load was never read takes this many at once
RETRY_AFTER_CAP_S = 30


@dataclass(frozen=True)
class Admission:
    action: Action
    wake: bool = False
    status: int = 0
    message: str = ""
    code: str | None = None
    retry_after_s: int | None = None


def retry_after_s(route: ModelRoute) -> int:
    """Retry-After for a model that cannot take a request now: its maxWait, capped."""
    return max(1, min(RETRY_AFTER_CAP_S, math.ceil(route.max_wait_s)))


def admit(route: ModelRoute, held: int, draining: bool) -> Admission:
    # Degraded with no ready pod: nothing will come to serve it, so never held. With ready pods it is served:
    # a rolled-back tier move, a failing new pod or a refused adapter leaves the pods that work working.
    if route.degraded is not None and not route.pods:
        return Admission("refuse", status=503, code="model_degraded",
                         message=f"The model {route.name!r} (InferenceModel {route.namespace}/{route.resource}) "
                                 f"is Degraded: {route.degraded}. Fix the InferenceModel; "
                                 f"`kubectl describe inferencemodel -n {route.namespace} {route.resource}` says more.")
    if draining:
        return Admission("refuse", status=503, code="draining", retry_after_s=1,
                         message="This gateway is shutting down: retry, and another replica will answer.")
    if route.pods and held == 0:
        return Admission("route")
    at_zero = route.replicas == 0
    if at_zero and route.scaling_disabled:
        kind, name = route.scaled_by
        what = f"The model {route.name!r}" + (f" (served by ModelPool {name})" if route.pool is not None else "")
        return Admission("refuse", status=503, code="scaled_to_zero",
                         message=f"{what} is scaled to zero and autoscaling is off (spec.scaling.disabled of its "
                                 f"{kind}): scale it up with `kubectl scale {kind.lower()} -n {route.namespace} "
                                 f"{name} --replicas=1`, or turn autoscaling on.")
    if held >= route.max_held:
        return Admission("refuse", status=429, code="hold_queue_full", retry_after_s=retry_after_s(route),
                         message=f"The model {route.name!r} is starting and already holds {route.max_held} "
                                 f"requests (spec.coldStart.maxHeld): retry after {retry_after_s(route)} s.")
    return Admission("hold", wake=at_zero)


def wakes_again(route: ModelRoute, held: int) -> bool:
    """Requests are held while what scales the model is at zero (a member whose pool was seen only after they
    came, or a scale to zero by hand): wake it, as the first hold would have."""
    return held > 0 and route.replicas == 0 and not route.scaling_disabled and route.degraded is None


def wait_spent(route: ModelRoute) -> Admission:
    return Admission("refuse", status=503, code="hold_timeout", retry_after_s=retry_after_s(route),
                     message=f"No pod of the model {route.name!r} became ready within {route.max_wait_s:g} s "
                             f"(spec.coldStart.maxWaitSeconds): retry after {retry_after_s(route)} s, or check "
                             f"the model's pods with `kubectl get pods -n {route.namespace}`.")


def pod_room(pod: PodView) -> int:
    """How many more held requests this pod takes now: never more in flight than its admission queue holds.
    A server counts a request as queued until its engine admits it, and a finished request frees its slot
    before the engine admits the next one, so counting the slots as room would race a full queue (429)."""
    if pod.load_age_s is None:
        return max(0, UNKNOWN_POD_ROOM - pod.in_flight)
    if pod.queue_capacity <= 0:
        return max(0, pod.slots - pod.load)
    return max(0, pod.queue_capacity - pod.load)


def releasable(pods: list[PodView] | tuple[PodView, ...], held: int) -> int:
    """How many held requests to release now: at most what the ready pods' queues take."""
    return min(held, sum(pod_room(p) for p in pods))
