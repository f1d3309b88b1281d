"""Who keeps a served model name that several InferenceModels claim: one rule for every InferenceModel,
dedicated or pooled, the rule flotilla-gateway routes by (docs/gateway.md, "Route map").

Pure functions of InferenceModel objects as the API lists them. The reconcilers act on the answer: the
model that does not hold its name is Degraded `ModelNameConflict`; a dedicated one keeps its Deployment,
which only its own Service reaches, while a pooled one does not join its pool, whose members file and
Service every member shares (docs/pools.md, "Members").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flotilla_operator.status import Problem

NAME_CONFLICT = "ModelNameConflict"


def served_name(model: Mapping[str, Any]) -> str | None:
    return ((model.get("spec") or {}).get("model") or {}).get("name")


def age(model: Mapping[str, Any]) -> tuple[str, str, str]:
    """The order in which claimants keep a name: creationTimestamp (RFC 3339 sorts as text), namespace, name."""
    meta = model["metadata"]
    return meta.get("creationTimestamp", ""), meta.get("namespace", ""), meta["name"]


def holders(models: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Served name -> the InferenceModel that keeps it: the oldest live one (one being deleted gives it up)."""
    found: dict[str, Mapping[str, Any]] = {}
    for model in sorted((m for m in models if not m["metadata"].get("deletionTimestamp")), key=age):
        name = served_name(model)
        if name is not None:
            found.setdefault(name, model)
    return found


def name_holder(name: str, models: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The InferenceModel that keeps `name` when several serve it; None when no live one does."""
    return holders(models).get(name)


def name_conflict(name: str, uid: str, held: Mapping[str, Mapping[str, Any]]) -> Problem | None:
    """Why the InferenceModel `uid` may not serve `name` (another, older one holds it), or None.

    `held` is holders() of every InferenceModel the operator can list; pool membership plays no part.
    """
    holder = held.get(name)
    if holder is None or holder["metadata"].get("uid") == uid:
        return None
    other = f'{holder["metadata"].get("namespace")}/{holder["metadata"]["name"]}'
    return Problem(NAME_CONFLICT, f'the model name "{name}" is already served by the older InferenceModel {other}, '
                                  "and the gateway routes it there; change spec.model.name")
