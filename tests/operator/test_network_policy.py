"""spec.networkPolicy: `flotilla-operator render` prints a NetworkPolicy that Kubernetes accepts, which lets
only the gateway's and Prometheus's pods reach the model's pods; the plan creates it, and deletes it when
the model turns it off."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from flotilla_operator import types
from flotilla_operator.manifests import Owner, desired_children
from flotilla_operator.plan import plan

from tests.chart.render import one, render
from tests.chart.test_manifests_valid import KUBERNETES_VERSIONS
from tests.operator.test_render import run_cli

MODEL = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceModel",
         "metadata": {"name": "sea", "namespace": "team-a"},
         "spec": {"model": {"name": "sea", "source": {"builtin": "tiny"}}, "networkPolicy": {"enabled": True}}}


def rendered(obj: dict) -> dict[str, dict]:
    result = run_cli("render", "-f", "-", stdin=yaml.safe_dump(obj))
    assert result.returncode == 0, result.stderr
    return {doc["kind"]: doc for doc in yaml.safe_load_all(result.stdout)}


def test_render_prints_a_strictly_valid_policy_for_the_models_pods():
    docs = rendered(MODEL)
    policy = docs["NetworkPolicy"]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(policy, version, strict=True)
    pod_labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # outbound traffic (model downloads) is left alone
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    gateway, prometheus = rule["from"]
    assert gateway == {"namespaceSelector": {"matchLabels": {}},
                       "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "flotilla",
                                                       "app.kubernetes.io/component": "gateway"}}}
    assert prometheus["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def test_the_default_gateway_peer_selects_the_charts_gateway_pods():
    gateway = one(render("default"), "Deployment", component="gateway")
    peer = types.NetworkPolicySpec().gateway.pod_labels
    assert peer.items() <= gateway["spec"]["template"]["metadata"]["labels"].items()


def test_selectors_can_be_set_and_off_means_no_policy():
    obj = copy.deepcopy(MODEL)
    obj["spec"]["networkPolicy"]["gateway"] = {"namespaceLabels": {"kubernetes.io/metadata.name": "flotilla-system"},
                                               "podLabels": {"app": "my-gateway"}}
    gateway = rendered(obj)["NetworkPolicy"]["spec"]["ingress"][0]["from"][0]
    assert gateway == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "flotilla-system"}},
                       "podSelector": {"matchLabels": {"app": "my-gateway"}}}
    obj["spec"]["networkPolicy"] = {"enabled": False}
    assert "NetworkPolicy" not in rendered(obj)
    del obj["spec"]["networkPolicy"]
    assert "NetworkPolicy" not in rendered(obj)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_plan_creates_it_and_deletes_it_when_turned_off(enabled):
    on = Owner("sea", "team-a", "uid-1", types.parse_spec(MODEL["spec"]))
    [policy] = [c for c in desired_children(on, "img:1", monitoring=False) if c["kind"] == "NetworkPolicy"]
    spec = copy.deepcopy(MODEL["spec"])
    spec["networkPolicy"]["enabled"] = enabled
    owner = Owner("sea", "team-a", "uid-1", types.parse_spec(spec))
    live = {("networking.k8s.io/v1", "NetworkPolicy", "sea"): {**copy.deepcopy(policy)}}
    result = plan(desired_children(owner, "img:1", monitoring=False), live, "uid-1")
    verbs = [(a.verb, a.kind) for a in result.actions if a.kind == "NetworkPolicy"]
    assert verbs == ([] if enabled else [("delete", "NetworkPolicy")])
    fresh = plan(desired_children(owner, "img:1", monitoring=False), {}, "uid-1")
    assert (("create", "NetworkPolicy") in [(a.verb, a.kind) for a in fresh.actions]) == enabled
