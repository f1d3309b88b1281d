"""Plan, then apply: from the children an InferenceModel should have and the ones it has, the list of
creates, updates and deletes, each with its reason (KubeAI's calculatePodPlan is the model).

`plan()` is pure and is the only place that decides; `apply.execute` carries a plan out and decides
nothing. The rules (docs/architecture.md, "Control plane"):

- A child that does not exist is created.
- A live child "matches" when every field we set has our value, so fields the API server defaults
  (imagePullPolicy, clusterIP, ...) never cause churn. A mismatch is an update: the spec replaced in
  place (PUT with the live resourceVersion), never a delete and re-create. Labels and annotations
  others added stay; the fields a Service's API server allocates stay.
- A live child that is ours (its controller owner reference is the model) and no longer desired is
  deleted. Children of other owners are never deleted.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flotilla_operator.quantity import QUANTITY_KEYS, same_quantity

Key = tuple[str, str, str]  # (apiVersion, kind, name)
Verb = Literal["create", "update", "delete"]
# Fields the API server allocates on a Service and refuses to have changed.
SERVICE_ALLOCATED = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "internalTrafficPolicy")
MAX_PATHS_IN_REASON = 3


def key_of(obj: Mapping[str, Any]) -> Key:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


@dataclass(frozen=True)
class Action:
    verb: Verb
    api_version: str
    kind: str
    namespace: str
    name: str
    reason: str
    body: dict[str, Any] | None = None  # what to send: None for delete

    @property
    def child(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...] = ()
    unchanged: tuple[str, ...] = field(default=())  # "Kind/name" of children that already match

    def of(self, verb: Verb) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.verb == verb)


def is_subset(desired: Any, live: Any, quantities: bool = False) -> bool:
    """Every value in `desired` is in `live`; lists must match element by element.

    Under `resources.limits`/`requests` and `sizeLimit` (`quantities`), values compare as quantities:
    the API server stores `0.5` as `500m`.
    """
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            k in live and is_subset(v, live[k], quantities or k in QUANTITY_KEYS) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(desired) == len(live) and all(
            is_subset(d, v, quantities) for d, v in zip(desired, live, strict=True))
    return same_quantity(desired, live) if quantities else desired == live


def differing_paths(desired: Any, live: Any, prefix: str = "", quantities: bool = False) -> list[str]:
    """Dotted paths where `live` lacks or differs from `desired` (lists compare as a whole)."""
    if isinstance(desired, dict) and isinstance(live, dict):
        paths = []
        for key, value in desired.items():
            path = f"{prefix}.{key}" if prefix else key
            inner = quantities or key in QUANTITY_KEYS
            if key not in live:
                paths.append(path)
            elif not is_subset(value, live[key], inner):
                paths += differing_paths(value, live[key], path, inner)
        return paths
    return [prefix or "(root)"]


def update_body(desired: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """`desired`, made safe to PUT over `live`: its resourceVersion, others' labels and annotations kept."""
    body = copy.deepcopy(desired)
    meta, live_meta = body["metadata"], live.get("metadata", {})
    meta["resourceVersion"] = live_meta.get("resourceVersion")
    meta["labels"] = {**(live_meta.get("labels") or {}), **meta.get("labels", {})}
    if live_meta.get("annotations"):  # others' annotations (deployment revision, kubectl) stay
        meta["annotations"] = {**live_meta["annotations"], **meta.get("annotations", {})}
    if body["kind"] == "Service":
        for key in SERVICE_ALLOCATED:
            if key in (live.get("spec") or {}):
                body["spec"][key] = live["spec"][key]
    return body


def controlled_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid and ref.get("controller")
               for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def plan(desired: Iterable[dict[str, Any]], observed: Mapping[Key, dict[str, Any]], owner_uid: str) -> Plan:
    """What to do so that `observed` (the live children found) becomes `desired`, and why."""
    actions: list[Action] = []
    unchanged: list[str] = []
    wanted: set[Key] = set()
    for child in desired:
        key = key_of(child)
        wanted.add(key)
        api_version, kind, name = key
        namespace = child["metadata"]["namespace"]
        live = observed.get(key)
        if live is None:
            actions.append(Action("create", api_version, kind, namespace, name, f"{kind} {name} does not exist", child))
        elif is_subset(child, live):
            unchanged.append(f"{kind}/{name}")
        else:
            paths = differing_paths(child, live)
            shown = ", ".join(paths[:MAX_PATHS_IN_REASON]) + (", ..." if len(paths) > MAX_PATHS_IN_REASON else "")
            actions.append(Action("update", api_version, kind, namespace, name, f"differs from the spec at {shown}",
                                  update_body(child, live)))
    for key, live in sorted(observed.items()):
        if key not in wanted and controlled_by(live, owner_uid):
            api_version, kind, name = key
            actions.append(Action("delete", api_version, kind, live["metadata"]["namespace"], name,
                                  "the spec no longer asks for it"))
    return Plan(tuple(actions), tuple(unchanged))
