"""served_names: which InferenceModel keeps a served name that several claim, dedicated or pooled alike; the
gateway routes by the same rule, and the model that does not hold its name gets ModelNameConflict."""

from __future__ import annotations

from typing import Any

import pytest
from flotilla_gateway.route_map import build_routes
from flotilla_operator.served_names import NAME_CONFLICT, holders, name_conflict, name_holder


def model(ns: str, name: str, served: str, created: str, deleting: bool = False,
          pool: str | None = None) -> dict[str, Any]:
    meta = {"namespace": ns, "name": name, "creationTimestamp": created, "uid": f"{ns}/{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-06-01T00:00:00Z"
    spec: dict[str, Any] = {"model": {"name": served}}
    if pool is not None:  # a cost-first member of a ModelPool
        spec |= {"pool": pool, "placement": {"policy": "cost-first"}}
    return {"metadata": meta, "spec": spec}


A = model("team-a", "llama", "llama", "2026-02-01T00:00:00Z")
B = model("team-b", "llama", "llama", "2026-01-01T00:00:00Z")
B_SAME_TIME = model("team-b", "llama", "llama", "2026-02-01T00:00:00Z")
C = model("team-a", "llama-2", "llama", "2026-02-01T00:00:00Z")
OTHER = model("team-c", "qwen", "qwen", "2025-01-01T00:00:00Z")
POOLED_OLD = model("team-a", "pooled-old", "llama", "2025-06-01T00:00:00Z", pool="shared")
POOLED_NEW = model("team-a", "pooled-new", "llama", "2026-03-01T00:00:00Z", pool="shared")
POOLED_OTHER_POOL = model("team-a", "pooled-other", "llama", "2026-03-01T00:00:00Z", pool="other")


@pytest.mark.parametrize(("models", "holder"), [
    ([A], A), ([A, B], B), ([B, A], B),  # the older wins, whatever the order
    ([A, B_SAME_TIME], A),  # same second: by namespace
    ([C, A], A),  # same second and namespace: by name
    ([A, model("team-b", "llama", "llama", "2026-01-01T00:00:00Z", deleting=True)], A),  # a deleted one gives it up
    ([OTHER], None),
    ([A, POOLED_OLD], POOLED_OLD), ([POOLED_NEW, A], A),  # a pooled member holds a name as a dedicated model does
    ([POOLED_NEW, POOLED_OLD], POOLED_OLD), ([POOLED_OTHER_POOL, POOLED_NEW, B], B),
])
def test_name_holder(models: list[dict[str, Any]], holder: dict[str, Any] | None) -> None:
    assert name_holder("llama", models) == holder
    routes = build_routes(models, [])
    if holder is not None:  # the gateway routes the name to the same InferenceModel
        assert (routes["llama"].namespace, routes["llama"].resource) == (holder["metadata"]["namespace"],
                                                                         holder["metadata"]["name"])


@pytest.mark.parametrize(("claimant", "others", "held_by"), [
    (A, [], None),  # alone
    (A, [OTHER], None),  # another name
    (B, [A], None),  # the older keeps it
    (A, [B], B),  # dedicated, an older dedicated holds it
    (POOLED_NEW, [A], A),  # pooled, an older dedicated holds it
    (POOLED_NEW, [POOLED_OLD], POOLED_OLD),  # pooled, an older member of the same pool holds it
    (POOLED_OTHER_POOL, [POOLED_OLD], POOLED_OLD),  # pooled, an older member of another pool holds it
    (A, [POOLED_OLD], POOLED_OLD),  # dedicated, an older pooled member holds it
    (POOLED_OLD, [A, POOLED_NEW, B], None),  # the oldest keeps it, pooled or not
    (A, [model("team-b", "llama", "llama", "2026-01-01T00:00:00Z", deleting=True)], None),  # a deleted one gives it up
])
def test_a_model_whose_served_name_an_older_one_holds_has_a_name_conflict(
        claimant: dict[str, Any], others: list[dict[str, Any]], held_by: dict[str, Any] | None) -> None:
    problem = name_conflict("llama", claimant["metadata"]["uid"], holders([claimant, *others]))
    if held_by is None:
        assert problem is None
        return
    assert problem is not None and problem.reason == NAME_CONFLICT
    holder = f'{held_by["metadata"]["namespace"]}/{held_by["metadata"]["name"]}'
    assert f"older InferenceModel {holder}," in problem.message and problem.message.endswith("change spec.model.name")


def test_holders_keeps_one_model_per_served_name() -> None:
    held = holders([A, B, C, OTHER, POOLED_NEW, POOLED_OLD])
    assert held == {"llama": POOLED_OLD, "qwen": OTHER}
