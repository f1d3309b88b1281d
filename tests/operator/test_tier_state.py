"""An adaptive model's children follow its status: pool membership, its Deployment, its Service, status.pool.

Each row is what a user would see in the cluster at one point of a move: whether the pool's members file lists
the model (with its adapters), whether it has a Deployment and how many replicas, and where the gateway routes.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import yaml
from flotilla_operator import pool_types, types
from flotilla_operator.adaptive_manifests import adaptive_children
from flotilla_operator.manifests import Owner
from flotilla_operator.pool_manifests import pool_selector
from flotilla_operator.pool_members import joins_pool, members
from flotilla_operator.render import render
from flotilla_operator.tier_moves import Children, Move
from flotilla_operator.tier_state import model_children, move_status, read_state

POOL = pool_types.parse_pool_spec({"volume": {"claimName": "models"}, "memoryBudget": "1Gi"})
T0 = 1_800_000_000.0


def adaptive(**extra: Any) -> types.InferenceModelSpec:
    return types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}, "placement": {"policy": "adaptive"},
                             "pool": "shared", "replicas": 2, "scaling": {"maxReplicas": 4},
                             "adapters": [{"name": "legal", "source": {"pvc": {"claimName": "models", "path": "legal"}}}],
                             **extra})


def status(tier: str | None = None, to: str | None = None, phase: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if tier is not None:
        found["tier"] = tier
    if to is not None:
        found["move"] = move_status(Move(to, phase or "Starting", T0, 3, "SustainedDemand"))
    return found


@pytest.mark.parametrize(("recorded", "member", "replicas", "to_pool"), [
    (status(), True, 0, True),  # never tiered: starts in its pool, as a cost-first member would
    (status("pool"), True, 0, True),
    # a promotion's Deployment is sized by the move (3), not by spec.replicas
    (status("pool", "dedicated", "Starting"), True, 3, True),  # both up, the pool serves until replicas are ready
    (status("pool", "dedicated", "Switching"), True, 3, False),  # the route has switched; the pool still finishes
    (status("pool", "dedicated", "Draining"), False, 3, False),  # the pool lets go
    (status("dedicated"), False, 2, False),
    (status("dedicated", "pool", "Loading"), True, 2, False),  # the pool loads it; the replicas serve
    (status("dedicated", "pool", "Switching"), True, 2, True),
    (status("dedicated", "pool", "Draining"), True, 0, True),  # the replicas drain to zero
])
def test_an_adaptive_models_children_follow_its_recorded_tier_and_move(recorded, member, replicas, to_pool):
    spec = adaptive()
    assert model_children(spec, recorded, 2) == Children(member, replicas, to_pool)
    assert joins_pool(spec, recorded) is member
    listed = members([("m", spec)], "shared", POOL, {"m": recorded})
    assert [m.model for m in listed] == (["m"] if member else [])
    if member:  # its adapters ride with it into the pool's members file
        assert [a.name for a in listed[0].adapters] == ["legal"]


@pytest.mark.parametrize(("policy", "pool", "expected"), [
    ("cost-first", "shared", Children(True, 0, True)),
    ("latency-first", "shared", Children(False, 3, False)),
    ("latency-first", None, Children(False, 3, False)),
])
def test_other_policies_ignore_any_recorded_tier(policy, pool, expected):
    spec = types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}, "placement": {"policy": policy},
                             "scaling": {"minReplicas": 0 if policy == "cost-first" else 1},
                             **({"pool": pool} if pool else {})})
    assert model_children(spec, status("dedicated"), 3) == expected


def test_a_move_that_cannot_be_read_is_dropped_and_the_tier_kept():
    state = read_state({"tier": "dedicated", "tierSince": "2026-12-05T10:00:00Z",
                        "move": {"to": "sideways", "phase": "Starting", "phaseSince": "2026-12-05T10:00:00Z"}})
    assert (state.tier, state.move) == ("dedicated", None) and state.since_s > 0
    assert read_state(None).tier == "pool" and read_state(None).since_s == float("-inf")
    recorded = move_status(Move("pool", "Loading", T0, 1, "DemandLow"))
    assert read_state({"tier": "dedicated", "move": recorded}).move == Move("pool", "Loading", T0, 1, "DemandLow")


def kinds(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {child["kind"]: child for child in children}


def test_the_dedicated_tier_gets_a_latency_first_models_children_and_the_pool_tier_a_members():
    owner = Owner("m", "default", "uid-1", adaptive())
    dedicated = kinds(adaptive_children(owner, "img", True, Children(False, 2, False), keep_deployment=False))
    assert set(dedicated) == {"Service", "ConfigMap", "Deployment", "PodDisruptionBudget", "ServiceMonitor"}
    assert dedicated["Deployment"]["spec"]["replicas"] == 2
    assert dedicated["Deployment"]["spec"]["template"]["spec"]["priorityClassName"] == "flotilla-latency-first"
    pooled = kinds(adaptive_children(owner, "img", True, Children(True, 0, True), keep_deployment=False))
    assert set(pooled) == {"Service"} and pooled["Service"]["spec"]["selector"] == pool_selector("shared")
    # a promotion starting: its Deployment is up, its Service still fronts the pool's pods
    starting = kinds(adaptive_children(owner, "img", True, Children(True, 3, True), keep_deployment=False))
    assert starting["Deployment"]["spec"]["replicas"] == 3 and starting["Service"]["spec"]["selector"] == pool_selector("shared")
    # a demotion draining: the Deployment stays, at zero, until its pods are gone
    draining = kinds(adaptive_children(owner, "img", True, Children(True, 0, True), keep_deployment=True))
    assert draining["Deployment"]["spec"]["replicas"] == 0


def test_render_shows_an_adaptive_model_in_its_starting_tier_the_pool():
    text = yaml.safe_dump_all([
        {"apiVersion": types.API_VERSION, "kind": "ModelPool", "metadata": {"name": "shared"},
         "spec": {"volume": {"claimName": "models"}, "memoryBudget": "1Gi"}},
        {"apiVersion": types.API_VERSION, "kind": "InferenceModel", "metadata": {"name": "m"},
         "spec": {"model": {"name": "m", "source": {"builtin": "tiny"}}, "placement": {"policy": "adaptive"},
                  "pool": "shared"}},
    ])
    children = render(text, "img", False)
    members_file = next(c for c in children if c["kind"] == "ConfigMap")
    assert "m=tiny" in "".join(members_file["data"].values())
    assert not any(c["kind"] == "Deployment" and c["metadata"]["name"] == "m" for c in children)


@pytest.mark.parametrize(("spec", "says"), [
    ({"placement": {"policy": "adaptive"}}, "placement.policy adaptive needs spec.pool"),
    ({"tiering": {"windowSeconds": 60}, "pool": "shared"}, "tiering applies to placement.policy adaptive only"),
    ({"placement": {"policy": "adaptive"}, "pool": "shared",
      "tiering": {"promoteDemandReplicas": 0.2, "demoteDemandReplicas": 0.2}}, "demoteDemandReplicas < promoteDemandReplicas"),
    ({"placement": {"policy": "adaptive"}, "pool": "shared", "tiering": {"promoteAttainment": 1.5}}, "less than or equal to 1"),
])
def test_the_parser_refuses_what_the_crd_refuses(spec, says):
    with pytest.raises(pydantic.ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}, **spec})
