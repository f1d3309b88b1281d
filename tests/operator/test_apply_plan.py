"""Child apply decisions: server defaults cause no churn; real drift is replaced in place."""

from __future__ import annotations

import copy

from flotilla_operator import types
from flotilla_operator.apply import is_subset, plan_child
from flotilla_operator.manifests import Owner, build_deployment, build_service

OWNER = Owner("m", "default", "uid-1", types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}}))


def served(obj: dict) -> dict:
    """`obj` as an API server stores it: metadata filled in, defaults added, status present."""
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="child-uid", resourceVersion="7", generation=1,
                            annotations={"deployment.kubernetes.io/revision": "1"})
    if live["kind"] == "Deployment":
        container = live["spec"]["template"]["spec"]["containers"][0]
        container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        live["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"
        live["status"] = {"replicas": 1}
    if live["kind"] == "Service":
        live["spec"].update(clusterIP="10.0.0.7", clusterIPs=["10.0.0.7"], ipFamilies=["IPv4"])
    return live


def test_missing_child_is_created():
    desired = build_deployment(OWNER, "img:1")
    assert plan_child(desired, None).action == "create"


def test_server_defaults_cause_no_change():
    for desired in (build_deployment(OWNER, "img:1"), build_service(OWNER, "img:1")):
        assert plan_child(desired, served(desired)).action == "keep"


def test_drift_is_replaced_in_place_keeping_what_the_server_owns():
    desired = build_deployment(OWNER, "img:1")
    live = served(desired)
    live["spec"]["template"]["spec"]["containers"][0]["args"] = ["--model", "hacked"]
    plan = plan_child(desired, live)
    assert plan.action == "replace"
    assert plan.body["metadata"]["resourceVersion"] == "7"  # optimistic concurrency on the replace
    assert plan.body["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert plan.body["spec"] == desired["spec"]


def test_service_replacement_keeps_its_cluster_ip():
    desired = build_service(OWNER, "img:1")
    live = served(desired)
    live["spec"]["ports"][0]["port"] = 9999
    plan = plan_child(desired, live)
    assert plan.action == "replace" and plan.body["spec"]["clusterIP"] == "10.0.0.7"


def test_is_subset_compares_lists_elementwise():
    assert is_subset({"a": [{"x": 1}]}, {"a": [{"x": 1, "y": 2}], "b": 3})
    assert not is_subset({"a": [{"x": 1}]}, {"a": [{"x": 1}, {"x": 2}]})
    assert not is_subset({"a": {"x": 1}}, {"a": {"x": 2}})
    assert not is_subset({"a": 1}, {})
