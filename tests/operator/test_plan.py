"""plan(desired, observed): what to create, update and delete for a model's children, and why."""

from __future__ import annotations

import copy

import pytest
from flotilla_operator import types
from flotilla_operator.manifests import Owner, build_deployment, build_pdb, build_service, desired_children
from flotilla_operator.plan import differing_paths, is_subset, key_of, plan
from hypothesis import HealthCheck, given, settings

from tests.operator.test_properties import specs
from tests.support.crd_schema import admit
from tests.support.examples import crd_schema
from tests.support.k8s_defaults import apply_defaults

OWNER = Owner("m", "default", "uid-1", types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}}))
DEPLOYMENT, SERVICE = build_deployment(OWNER, "img:1"), build_service(OWNER, "img:1")
PDB = build_pdb(Owner("m", "default", "uid-1", types.parse_spec({
    "model": {"name": "m", "source": {"builtin": "tiny"}}, "replicas": 2,
    "scaling": {"minReplicas": 2, "maxReplicas": 4}, "placement": {"policy": "latency-first"}})), "img:1")


def served(obj: dict) -> dict:
    """`obj` as an API server stores it: metadata filled in, defaults added, quantities canonical, status present."""
    live = copy.deepcopy(obj)
    if live["kind"] == "Service":
        live["spec"].update(clusterIP="10.0.0.7")
    live = apply_defaults(live["kind"], live)
    live["metadata"].update(uid="child-uid", resourceVersion="7", generation=1,
                            annotations={"deployment.kubernetes.io/revision": "1"})
    if live["kind"] == "Deployment":
        live["status"] = {"replicas": 1}
    return live


def with_resources(cpu: str, memory: str) -> dict:
    spec = {"model": {"name": "m", "source": {"builtin": "tiny"}}, "resources": {"cpu": cpu, "memory": memory}}
    return build_deployment(Owner("m", "default", "uid-1", types.parse_spec(spec)), "img:1")


HALF_CPU = with_resources("0.5", "1.5Gi")


def drifted(obj: dict) -> dict:
    live = served(obj)
    if live["kind"] == "Deployment":
        live["spec"]["template"]["spec"]["containers"][0]["args"] = ["--model", "hacked"]
    else:
        live["spec"]["ports"][0]["port"] = 9999
    return live


def someone_elses(obj: dict) -> dict:
    live = served(obj)
    live["metadata"]["ownerReferences"] = [{**live["metadata"]["ownerReferences"][0], "uid": "other-uid"}]
    return live


def summary(desired: list[dict], live: list[dict]) -> list[tuple[str, str]]:
    result = plan(desired, {key_of(obj): obj for obj in live}, OWNER.uid)
    return [(a.verb, a.child) for a in result.actions]


@pytest.mark.parametrize(("desired", "live", "expected"), [
    pytest.param([DEPLOYMENT, SERVICE], [], [("create", "Deployment/m"), ("create", "Service/m")], id="nothing yet"),
    pytest.param([DEPLOYMENT, SERVICE], [served(DEPLOYMENT), served(SERVICE)], [], id="server defaults: no churn"),
    pytest.param([DEPLOYMENT, SERVICE], [drifted(DEPLOYMENT), served(SERVICE)], [("update", "Deployment/m")], id="drift"),
    pytest.param([HALF_CPU], [served(HALF_CPU)], [], id="0.5 stored as 500m, 1.5Gi as 1536Mi: no churn"),
    pytest.param([HALF_CPU], [served(with_resources("0.5", "1Gi"))], [("update", "Deployment/m")],
                 id="a real change of quantity is drift"),
    pytest.param([DEPLOYMENT], [served(DEPLOYMENT), served(PDB)], [("delete", "PodDisruptionBudget/m")], id="PDB unwanted"),
    pytest.param([DEPLOYMENT], [served(DEPLOYMENT), someone_elses(PDB)], [], id="others' objects are never deleted"),
    pytest.param([DEPLOYMENT, PDB], [served(PDB)], [("create", "Deployment/m")], id="only the missing one"),
    pytest.param([SERVICE], [drifted(SERVICE), served(PDB)], [("update", "Service/m"), ("delete", "PodDisruptionBudget/m")],
                 id="update then delete"),
])
def test_plan_table(desired, live, expected):
    assert summary(desired, live) == expected


def test_every_action_says_why():
    result = plan([DEPLOYMENT, SERVICE], {key_of(o): o for o in (drifted(DEPLOYMENT), served(PDB))}, OWNER.uid)
    reasons = {a.child: a.reason for a in result.actions}
    assert reasons == {
        "Deployment/m": "differs from the spec at spec.template.spec.containers",
        "Service/m": "Service m does not exist",
        "PodDisruptionBudget/m": "the spec no longer asks for it",
    }
    assert result.unchanged == ()


def test_an_update_replaces_in_place_keeping_what_the_server_owns():
    (action,) = plan([DEPLOYMENT], {key_of(DEPLOYMENT): drifted(DEPLOYMENT)}, OWNER.uid).actions
    assert action.body["metadata"]["resourceVersion"] == "7"  # optimistic concurrency on the PUT
    assert action.body["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert action.body["spec"] == DEPLOYMENT["spec"]


def test_a_service_update_keeps_its_cluster_ip():
    (action,) = plan([SERVICE], {key_of(SERVICE): drifted(SERVICE)}, OWNER.uid).actions
    assert action.verb == "update" and action.body["spec"]["clusterIP"] == "10.0.0.7"


def test_plan_is_pure():
    live = {key_of(DEPLOYMENT): drifted(DEPLOYMENT)}
    before = copy.deepcopy((DEPLOYMENT, live))
    assert plan([DEPLOYMENT], live, OWNER.uid) == plan([DEPLOYMENT], live, OWNER.uid)
    assert (DEPLOYMENT, live) == before


def test_is_subset_compares_lists_elementwise():
    assert is_subset({"a": [{"x": 1}]}, {"a": [{"x": 1, "y": 2}], "b": 3})
    assert not is_subset({"a": [{"x": 1}]}, {"a": [{"x": 1}, {"x": 2}]})
    assert not is_subset({"a": {"x": 1}}, {"a": {"x": 2}})
    assert not is_subset({"a": 1}, {})


def test_quantities_compare_by_value_only_where_they_are_quantities():
    assert is_subset({"limits": {"cpu": "0.5", "memory": "1.5Gi"}}, {"limits": {"cpu": "500m", "memory": "1536Mi"}})
    assert not is_subset({"limits": {"cpu": "0.5"}}, {"limits": {"cpu": "5"}})
    assert not is_subset({"labels": {"size": "1k"}}, {"labels": {"size": "1000"}})  # a label is a string
    assert served(HALF_CPU)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"


def test_differing_paths_name_the_fields():
    assert differing_paths({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 1, "c": 9}}) == ["a.c", "d"]


def children_for(spec: dict) -> list[dict]:
    stored, errors = admit(crd_schema(), {"apiVersion": types.API_VERSION, "kind": types.KIND,
                                          "metadata": {"name": "m", "namespace": "default"}, "spec": spec})
    assert errors == []
    return desired_children(Owner("m", "default", OWNER.uid, types.parse_spec(stored["spec"])), "img:1", monitoring=False)


def carry_out(result, observed: dict) -> dict:
    """What the API server holds after the plan, as `apply.execute` would leave it."""
    after = dict(observed)
    for action in result.actions:
        key = (action.api_version, action.kind, action.name)
        if action.verb == "delete":
            del after[key]
        else:
            after[key] = served(action.body)
    return after


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(), specs())
def test_one_plan_converges_and_keeps_what_is_wanted(before, now):
    observed = {key_of(c): served(c) for c in children_for(before)}
    desired = children_for(now)
    result = plan(desired, observed, OWNER.uid)
    wanted = {key_of(c) for c in desired}
    assert all(a.reason for a in result.actions)
    assert not any(a.verb == "delete" and (a.api_version, a.kind, a.name) in wanted for a in result.actions)
    assert plan(desired, carry_out(result, observed), OWNER.uid).actions == ()  # nothing left to do
