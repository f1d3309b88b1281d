"""Placement: the two policies differ in the pod template exactly as DESIGN.md's table says."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from flotilla_operator import types
from flotilla_operator.manifests import Owner, build_deployment, build_pdb
from flotilla_operator.placement import render_placement
from flotilla_operator.types import PlacementSpec, Toleration

SELECTOR = {"app.kubernetes.io/name": "flotilla-server", "app.kubernetes.io/instance": "m"}


def owner(policy: str, **placement) -> Owner:
    spec = types.parse_spec({
        "model": {"name": "m", "source": {"builtin": "tiny"}},
        "resources": {"gpus": 1, "gpuType": "NVIDIA-L4"},
        "placement": {"policy": policy, **placement},
    })
    return Owner("m", "default", "uid-1", spec)


def deployment(policy: str, **placement) -> dict:
    return build_deployment(owner(policy, **placement), types.DEFAULT_SERVER_IMAGE)


def test_pod_templates_differ_exactly_in_the_tables_fields():
    latency, cost = deployment("latency-first"), deployment("cost-first")
    latency_pod, cost_pod = latency["spec"]["template"]["spec"], cost["spec"]["template"]["spec"]
    differing = {key for key in latency_pod.keys() | cost_pod.keys() if latency_pod.get(key) != cost_pod.get(key)}
    assert differing == {"affinity", "topologySpreadConstraints", "tolerations", "priorityClassName"}
    assert latency_pod["nodeSelector"] == cost_pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    rest_latency, rest_cost = copy.deepcopy(latency), copy.deepcopy(cost)
    for whole in (rest_latency, rest_cost):
        del whole["spec"]["template"]["spec"]
        del whole["spec"]["strategy"]
    assert rest_latency == rest_cost  # nothing else differs: same containers, labels, replicas
    assert latency["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert cost["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_latency_first_spreads_on_dedicated_nodes_at_high_priority_with_a_pdb():
    placement = render_placement(PlacementSpec(policy="latency-first"), SELECTOR)
    anti = placement.affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [{"labelSelector": {"matchLabels": SELECTOR}, "topologyKey": "kubernetes.io/hostname"}]
    assert "podAffinity" not in placement.affinity
    [spread] = placement.topology_spread_constraints
    assert spread["topologyKey"] == "topology.kubernetes.io/zone" and spread["maxSkew"] == 1
    assert placement.tolerations == [
        {"key": "flotilla.dev/pool", "operator": "Equal", "value": "dedicated", "effect": "NoSchedule"}]
    pool = placement.affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert pool["preference"]["matchExpressions"][0]["values"] == ["dedicated"]
    assert placement.priority_class_name == "flotilla-latency-first"
    assert placement.pdb_min_available == 1


def test_cost_first_packs_on_spot_nodes_at_low_priority_without_a_pdb():
    placement = render_placement(PlacementSpec(policy="cost-first"), SELECTOR)
    [pack] = placement.affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pack["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert pack["podAffinityTerm"]["labelSelector"] == {"matchLabels": {"app.kubernetes.io/part-of": "flotilla"}}
    assert "podAntiAffinity" not in placement.affinity
    assert placement.topology_spread_constraints == []
    assert {t["key"] for t in placement.tolerations} >= {"flotilla.dev/pool", "cloud.google.com/gke-spot"}
    assert all(t.get("value") != "dedicated" for t in placement.tolerations)
    assert placement.priority_class_name == "flotilla-cost-first"
    assert placement.pdb_min_available is None
    assert build_pdb(owner("cost-first"), types.DEFAULT_SERVER_IMAGE) is None
    assert build_pdb(owner("latency-first"), types.DEFAULT_SERVER_IMAGE)["spec"]["minAvailable"] == 1


@pytest.mark.parametrize("policy", ["latency-first", "cost-first"])
def test_user_fields_merge_on_top(policy):
    user = PlacementSpec(
        policy=policy, node_selector={"team": "search", "nvidia.com/gpu.product": "NVIDIA-A100"},
        tolerations=[Toleration(key="team", operator="Equal", value="search", effect="NoSchedule")],
        priority_class_name="search-critical",
    )
    base = render_placement(PlacementSpec(policy=policy), SELECTOR, 1, "NVIDIA-L4")
    merged = render_placement(user, SELECTOR, 1, "NVIDIA-L4")
    assert merged.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100", "team": "search"}  # the user's key wins
    assert merged.tolerations == [*base.tolerations,
                                  {"key": "team", "operator": "Equal", "value": "search", "effect": "NoSchedule"}]
    assert merged.priority_class_name == "search-critical"
    assert merged.affinity == base.affinity and merged.pdb_min_available == base.pdb_min_available


def test_a_user_toleration_equal_to_the_policys_is_not_duplicated():
    user = PlacementSpec(policy="latency-first", tolerations=[
        Toleration(key="flotilla.dev/pool", operator="Equal", value="dedicated", effect="NoSchedule")])
    assert len(render_placement(user, SELECTOR).tolerations) == 1


def test_gpu_models_tolerate_the_gpu_taint_and_cpu_models_do_not():
    gpu = render_placement(PlacementSpec(policy="cost-first"), SELECTOR, gpus=1)
    cpu = render_placement(PlacementSpec(policy="cost-first"), SELECTOR, gpus=0, gpu_type=None)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu.tolerations
    assert all(t["key"] != "nvidia.com/gpu" for t in cpu.tolerations)
    assert gpu.node_selector == {} == cpu.node_selector  # no gpuType: no product selector


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
@pytest.mark.parametrize("policy", ["latency-first", "cost-first"])
def test_both_policies_pass_kubernetes_validate_strict(policy, version):
    with_user = {"nodeSelector": {"team": "a"}, "tolerations": [{"key": "team", "operator": "Exists"}],
                 "priorityClassName": "custom"}
    for placement in ({}, with_user):
        kubernetes_validate.validate(deployment(policy, **placement), version, strict=True)
    pdb = build_pdb(owner(policy), types.DEFAULT_SERVER_IMAGE)
    if pdb is not None:
        kubernetes_validate.validate(pdb, version, strict=True)
