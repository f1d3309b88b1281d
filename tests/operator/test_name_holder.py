"""name_holder: which InferenceModel keeps a served name that several claim; the gateway routes by the same rule."""

from __future__ import annotations

from typing import Any

import pytest
from flotilla_gateway.route_map import build_routes
from flotilla_operator.reconciler import name_holder


def model(ns: str, name: str, served: str, created: str, deleting: bool = False) -> dict[str, Any]:
    meta = {"namespace": ns, "name": name, "creationTimestamp": created, "uid": f"{ns}/{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-06-01T00:00:00Z"
    return {"metadata": meta, "spec": {"model": {"name": served}}}


A = model("team-a", "llama", "llama", "2026-02-01T00:00:00Z")
B = model("team-b", "llama", "llama", "2026-01-01T00:00:00Z")
B_SAME_TIME = model("team-b", "llama", "llama", "2026-02-01T00:00:00Z")
C = model("team-a", "llama-2", "llama", "2026-02-01T00:00:00Z")
OTHER = model("team-c", "qwen", "qwen", "2025-01-01T00:00:00Z")


@pytest.mark.parametrize(("models", "holder"), [
    ([A], A), ([A, B], B), ([B, A], B),  # the older wins, whatever the order
    ([A, B_SAME_TIME], A),  # same second: by namespace
    ([C, A], A),  # same second and namespace: by name
    ([A, model("team-b", "llama", "llama", "2026-01-01T00:00:00Z", deleting=True)], A),  # a deleted one gives it up
    ([OTHER], None),
])
def test_name_holder(models: list[dict[str, Any]], holder: dict[str, Any] | None) -> None:
    assert name_holder("llama", models) == holder
    routes = build_routes(models, [])
    if holder is not None:  # the gateway routes the name to the same InferenceModel
        assert (routes["llama"].namespace, routes["llama"].resource) == (holder["metadata"]["namespace"],
                                                                         holder["metadata"]["name"])
