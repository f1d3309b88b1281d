"""From InferenceModels, ModelPools and EndpointSlices to the route of each served model name: a pure function.

Rules:
- a model is known as soon as its InferenceModel exists, with or without ready pods (a known model is
  held, never 404: docs/gateway.md, "Route map");
- two InferenceModels serving one name: the older (creationTimestamp, then namespace, then name) keeps the
  name; the operator marks the other Degraded ModelNameConflict with the same rule;
- a model's pods are the ready endpoints of the EndpointSlices labelled with its Service's name (the
  Service is named after the InferenceModel, in its namespace); an endpoint with no `ready` condition
  counts as ready, as Kubernetes documents;
- a pooled model (its `status.pool` names the ModelPool it joined: the operator decides membership) routes to
  its pool's ready pods instead: the endpoints of the pool's Service (`NAME-pool`, labels.pool_child_name).
  The pool scales it and is woken for it, so its replicas, generation and `scaling.disabled` are the
  pool's; the pool's `scaling.targetQueueDepth` is the waiting per copy above which it gets a second copy
  (residency.py). Its hold bounds and Degraded condition stay the InferenceModel's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flotilla_contract.labels import SERVICE_NAME_LABEL, pool_child_name

DEFAULT_MAX_HELD = 256
DEFAULT_MAX_WAIT_S = 300.0
DEFAULT_POOL_TARGET_WAITING = 8.0  # the ModelPool CRD's scaling.targetQueueDepth default (a test holds them equal)
SERVICE_PORT_NAME = "http"


@dataclass(frozen=True)
class ModelRoute:
    name: str  # the served model name, as clients send it in `model`
    namespace: str
    resource: str  # the InferenceModel's metadata.name (also its Service's name)
    created: str = ""  # creationTimestamp, RFC 3339 (sorts as text)
    generation: int = 0  # metadata.generation of what scales it (the model, or its pool): every scale write bumps it
    replicas: int | None = None  # spec.replicas of what scales it; None when unset (or the pool is not seen)
    scaling_disabled: bool = False
    policy: str | None = None  # spec.routing.policy; None: the default per endpoint
    max_held: int = DEFAULT_MAX_HELD
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    degraded: str | None = None  # the Degraded condition's message while it is True
    pods: tuple[str, ...] = field(default=())  # ready endpoints, "host:port", sorted
    pool: str | None = None  # the ModelPool serving it (status.pool); None: its own Deployment
    target_waiting: float = DEFAULT_POOL_TARGET_WAITING  # pooled: waiting per copy above which it gets another

    @property
    def scaled_by(self) -> tuple[str, str]:
        """(kind, name) of the object whose scale subresource wakes it."""
        return ("ModelPool", self.pool) if self.pool is not None else ("InferenceModel", self.resource)


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def degraded_message(model: dict[str, Any]) -> str | None:
    for condition in _get(model, "status", "conditions") or []:
        if condition.get("type") == "Degraded" and condition.get("status") == "True":
            reason = condition.get("reason") or "Degraded"
            return f"{reason}: {condition.get('message') or 'the operator reports the model Degraded'}"
    return None


def route_of(model: dict[str, Any]) -> ModelRoute:
    meta = model.get("metadata", {})
    spec = model.get("spec", {}) or {}
    cold = spec.get("coldStart") or {}
    replicas = spec.get("replicas")
    return ModelRoute(
        name=_get(spec, "model", "name") or meta["name"],
        namespace=meta.get("namespace", ""),
        resource=meta["name"],
        created=meta.get("creationTimestamp", ""),
        generation=int(meta.get("generation") or 0),
        replicas=int(replicas) if replicas is not None else None,
        scaling_disabled=bool(_get(spec, "scaling", "disabled")),
        policy=_get(spec, "routing", "policy"),
        max_held=int(cold.get("maxHeld", DEFAULT_MAX_HELD)),
        max_wait_s=float(cold.get("maxWaitSeconds", DEFAULT_MAX_WAIT_S)),
        degraded=degraded_message(model),
        pool=_get(model, "status", "pool") or None,
    )


def pooled(route: ModelRoute, pool: dict[str, Any] | None) -> ModelRoute:
    """A member's route with its pool's scale figures; `pool` None: the pool is not seen (yet)."""
    spec = (pool or {}).get("spec") or {}
    replicas, target = spec.get("replicas"), _get(spec, "scaling", "targetQueueDepth")
    return ModelRoute(**{
        **route.__dict__,
        "generation": int(_get(pool, "metadata", "generation") or 0),
        "replicas": int(replicas) if replicas is not None else None,
        "scaling_disabled": bool(_get(spec, "scaling", "disabled")),
        "target_waiting": float(target) if target is not None else DEFAULT_POOL_TARGET_WAITING,
    })


def ready_endpoints(endpoint_slice: dict[str, Any]) -> list[str]:
    """The slice's ready addresses as host:port (the port named "http", else the first)."""
    ports = endpoint_slice.get("ports") or []
    port = next((p.get("port") for p in ports if p.get("name") == SERVICE_PORT_NAME), None)
    if port is None and ports:
        port = ports[0].get("port")
    if port is None:
        return []
    found = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready", True) is False or conditions.get("terminating") is True:
            continue
        for address in (endpoint.get("addresses") or [])[:1]:  # one address per endpoint is one pod
            host = f"[{address}]" if ":" in address else address
            found.append(f"{host}:{port}")
    return found


def build_routes(models: Iterable[dict[str, Any]], slices: Iterable[dict[str, Any]],
                 pools: Iterable[dict[str, Any]] = ()) -> dict[str, ModelRoute]:
    """Served name → route, for every InferenceModel not being deleted."""
    pool_objects = {(_get(p, "metadata", "namespace") or "", _get(p, "metadata", "name")): p for p in pools
                    if not _get(p, "metadata", "deletionTimestamp")}
    pods: dict[tuple[str, str], set[str]] = {}
    for endpoint_slice in slices:
        meta = endpoint_slice.get("metadata", {})
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if service:
            pods.setdefault((meta.get("namespace", ""), service), set()).update(ready_endpoints(endpoint_slice))
    routes: dict[str, ModelRoute] = {}
    live = [m for m in models if not _get(m, "metadata", "deletionTimestamp")]
    for model in sorted(live, key=lambda m: (_get(m, "metadata", "creationTimestamp") or "",
                                             _get(m, "metadata", "namespace") or "", _get(m, "metadata", "name"))):
        route = route_of(model)
        if route.name in routes:
            continue  # the older InferenceModel keeps the name; the operator marks this one Degraded
        service = route.resource
        if route.pool is not None:
            route = pooled(route, pool_objects.get((route.namespace, route.pool)))
            service = pool_child_name(route.pool)
        found = tuple(sorted(pods.get((route.namespace, service), ())))
        routes[route.name] = ModelRoute(**{**route.__dict__, "pods": found})
    return routes
