"""Which model serves each LoRA adapter, learned from the pods' load reports: a pure function, like the route map.

Why from the reports: each server lists the adapters a request may name on it, with each one's base
(flotilla_contract.load.ServerLoad.adapters), so the gateway learns them without an operator field and sees
runtime loads, list-file changes and refusals as the servers do.

Rules (`adapter_bases`):
- an adapter belongs to the model `base` when a pod of that model's route reports it with that base (a pool
  pod reports several bases: each adapter goes to the route of its own base);
- a model whose pods have no report (scaled to zero, just started) keeps the adapters it had, so a request
  for one is held and wakes the model as a request for the model does; once a pod of it reports, the model's
  adapters are what its pods report, and a model gone from the route map loses its adapters;
- a name that is a model's name is the model's (the adapter is not reachable through this gateway);
- a name that two models serve goes to the older model (creationTimestamp, then namespace, then name: the
  route map's rule for two models of one name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flotilla_gateway.route_map import ModelRoute


def adapter_bases(routes: Mapping[str, ModelRoute], reported: Mapping[str, Iterable[tuple[str, str]]],
                  before: Mapping[str, str]) -> dict[str, str]:
    """Adapter name → the model (route name) it is served on. `reported`: address → its report's (adapter,
    base) pairs, for the pods with a report; `before`: the previous answer."""
    order = sorted(routes.values(), key=lambda r: (r.created, r.namespace, r.name))
    found: dict[str, str] = {}
    for route in order:
        addresses = [a for a in route.pods if a in reported]
        if addresses:
            names = sorted({name for a in addresses for name, base in reported[a] if base == route.name})
        else:
            names = sorted(name for name, base in before.items() if base == route.name)
        for name in names:
            if name not in routes:
                found.setdefault(name, route.name)
    return found


def model_cards(routes: Mapping[str, ModelRoute], adapters: Mapping[str, str]) -> list[dict[str, Any]]:
    """GET /v1/models: every model once, then every adapter once with `parent` its model (as vLLM lists them)."""
    cards: list[dict[str, Any]] = []
    for r in sorted(routes.values(), key=lambda r: r.name):
        status = "degraded" if r.degraded else ("ready" if r.pods else "scaled_to_zero"
                                                if r.replicas == 0 else "starting")
        cards.append({"id": r.name, "object": "model", "owned_by": "flotilla", "namespace": r.namespace,
                      "ready_replicas": len(r.pods), "replicas": r.replicas, **({"pool": r.pool} if r.pool else {}),
                      "status": status})
    for name, base in sorted(adapters.items()):
        route = routes.get(base)
        if route is not None:
            cards.append({"id": name, "object": "model", "owned_by": "flotilla", "parent": base, "root": name,
                          "namespace": route.namespace})
    return cards
