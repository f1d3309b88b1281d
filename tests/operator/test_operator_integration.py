"""The real operator (a `flotilla-operator` subprocess running kopf) against the HTTP Kubernetes emulator.

Timing margins: the drift interval is 2 s and every wait allows several intervals, because the
machine is shared and slow; the waits poll, so a fast machine finishes early.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import httpx
import pytest
import yaml
from flotilla_operator import types
from flotilla_operator.manifests import Owner, build_deployment, build_pdb, build_service
from flotilla_operator.plan import is_subset

from tests.support.examples import EXAMPLES, ROOT, crd, load_example, pool_crd
from tests.support.k8s_defaults import apply_defaults
from tests.support.k8s_emulator import EmulatorHandle, serve
from tests.support.operator_process import operator_process
from tests.support.rbac import allows

DRIFT_S = 2.0
WAIT_S = 15.0
IM = ("flotilla.dev/v1alpha1", "inferencemodels")
DEPLOYMENTS = ("apps/v1", "deployments")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cluster")
    with serve(directory, crds=[crd()]) as k8s:
        k8s.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "models", "namespace": "default"}, "spec": {}})
        with operator_process(k8s.kubeconfig, directory, "--drift-interval-s", str(DRIFT_S)) as op:
            yield k8s, op


def tiny(name: str, **spec: Any) -> dict[str, Any]:
    obj = load_example(next(p for p in EXAMPLES if p.name == "tiny-cpu.yaml"))
    obj["metadata"]["name"] = name
    obj["spec"]["model"]["name"] = name  # one served name per model: a shared one is a ModelNameConflict
    obj["spec"].update(copy.deepcopy(spec))
    return obj


def status_of(k8s: EmulatorHandle, name: str) -> dict[str, Any]:
    return (k8s.get(*IM, name, "default") or {}).get("status") or {}


def condition(k8s: EmulatorHandle, name: str, type_: str) -> tuple[str, str] | None:
    for c in status_of(k8s, name).get("conditions", []):
        if c["type"] == type_:
            return c["status"], c["reason"]
    return None


def wait_deployment(k8s: EmulatorHandle, name: str, check=lambda d: True) -> dict[str, Any]:
    def ready():
        deployment = k8s.get(*DEPLOYMENTS, name, "default")
        return deployment if deployment and check(deployment) else None
    return k8s.eventually(ready, WAIT_S, message=f"Deployment {name}")


def args_of(deployment: dict[str, Any]) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def set_deployment_status(k8s: EmulatorHandle, name: str, replicas: int, ready: int) -> None:
    generation = k8s.get(*DEPLOYMENTS, name, "default")["metadata"]["generation"]
    k8s.patch(*DEPLOYMENTS, name, "default", {"status": {
        "replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas, "observedGeneration": generation,
    }}, subresource="status")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_applying_an_example_creates_the_right_children(cluster, path):
    k8s, _ = cluster
    obj = load_example(path)
    created = k8s.create(obj)
    name, uid = obj["metadata"]["name"], created["metadata"]["uid"]
    deployment = wait_deployment(k8s, name)
    owner = Owner(name, "default", uid, types.parse_spec(created["spec"]))
    expected = build_deployment(owner, types.DEFAULT_SERVER_IMAGE)
    # GPU limits, args, probes, placement: all as built (plus what the API server adds to every Deployment)
    assert deployment["spec"] == apply_defaults("Deployment", expected)["spec"]
    assert deployment["metadata"]["ownerReferences"] == expected["metadata"]["ownerReferences"]
    assert deployment["metadata"]["labels"] == expected["metadata"]["labels"]
    service = k8s.eventually(lambda: k8s.get("v1", "services", name, "default"), WAIT_S)
    assert is_subset(build_service(owner, types.DEFAULT_SERVER_IMAGE)["spec"], service["spec"])
    pdb = k8s.get("policy/v1", "poddisruptionbudgets", name, "default")
    expected_pdb = build_pdb(owner, types.DEFAULT_SERVER_IMAGE)
    assert (pdb is None) == (expected_pdb is None)
    status = k8s.eventually(lambda: status_of(k8s, name).get("phase") and status_of(k8s, name), WAIT_S)
    assert status["endpoint"] == f"http://{name}.default.svc.cluster.local:8000/v1"
    assert status["observedGeneration"] == 1 and status["desiredReplicas"] == obj["spec"]["replicas"]
    assert status["phase"] == "Progressing"
    events = k8s.list("v1", "events", "default")
    reasons = {(e["reason"], e["message"]) for e in events if e["involvedObject"]["name"] == name}
    assert ("Created", f"Created Deployment {name}: Deployment {name} does not exist") in reasons


def test_spec_change_updates_the_same_deployment_in_place(cluster):
    k8s, _ = cluster
    k8s.create(tiny("update-me"))
    first = wait_deployment(k8s, "update-me")
    k8s.patch(*IM, "update-me", "default", {"spec": {"server": {"maxNumSeqs": 16}}})
    second = wait_deployment(k8s, "update-me", lambda d: args_of(d)[args_of(d).index("--max-num-seqs") + 1] == "16")
    k8s.patch(*IM, "update-me", "default", {"spec": {"image": "registry.example/flotilla-server:0.2.0"}})
    third = wait_deployment(k8s, "update-me", lambda d: d["spec"]["template"]["spec"]["containers"][0]["image"]
                            == "registry.example/flotilla-server:0.2.0")
    assert first["metadata"]["uid"] == second["metadata"]["uid"] == third["metadata"]["uid"]
    assert third["metadata"]["generation"] == 3  # two in-place spec updates
    deleted = [e for _, _, e in list(k8s.emulator.log)
               if e["type"] == "DELETED" and e["object"]["metadata"]["name"] == "update-me"]
    assert deleted == []
    k8s.eventually(lambda: status_of(k8s, "update-me").get("observedGeneration") == 3, WAIT_S)


def test_drift_is_corrected_within_the_drift_interval(cluster):
    k8s, _ = cluster
    k8s.create(tiny("drifty"))
    original = wait_deployment(k8s, "drifty")
    hacked = copy.deepcopy(original["spec"]["template"]["spec"]["containers"])
    hacked[0]["args"] = ["--model", "something-else"]
    k8s.patch(*DEPLOYMENTS, "drifty", "default", {"spec": {"template": {"spec": {"containers": hacked}}}})
    started = time.monotonic()
    restored = wait_deployment(k8s, "drifty", lambda d: args_of(d) == args_of(original))
    assert time.monotonic() - started < DRIFT_S + 5.0  # the timer fires every DRIFT_S; 5 s of slack
    assert restored["metadata"]["uid"] == original["metadata"]["uid"]
    k8s.delete(*DEPLOYMENTS, "drifty", "default")
    started = time.monotonic()
    recreated = wait_deployment(k8s, "drifty", lambda d: d["metadata"]["uid"] != original["metadata"]["uid"])
    assert time.monotonic() - started < DRIFT_S + 5.0
    assert recreated["spec"] == original["spec"]


def test_canonicalised_quantities_cause_no_writes_over_five_drift_ticks(cluster):
    k8s, _ = cluster
    k8s.create(tiny("halfcpu", resources={"gpus": 0, "cpu": "0.5", "memory": "1.5Gi"}))
    deployment = wait_deployment(k8s, "halfcpu")
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["cpu"], limits["memory"]) == ("500m", "1536Mi")  # stored as a real API server stores them
    k8s.eventually(lambda: status_of(k8s, "halfcpu").get("phase"), WAIT_S)
    start = len(k8s.emulator.audit)
    ticks = 5
    time.sleep(ticks * DRIFT_S + 1)
    writes = [e for e in k8s.emulator.audit[start:] if e.verb in ("update", "patch") and e.resource in
              ("deployments", "services", "poddisruptionbudgets") and not e.user_agent.startswith("python-httpx")]
    assert writes == [], writes
    rv = k8s.get(*DEPLOYMENTS, "halfcpu", "default")["metadata"]["resourceVersion"]
    assert rv == deployment["metadata"]["resourceVersion"]


def test_deployment_status_flows_into_model_status(cluster):
    k8s, _ = cluster
    k8s.create(tiny("statusy", replicas=2))
    wait_deployment(k8s, "statusy")
    set_deployment_status(k8s, "statusy", replicas=2, ready=0)
    k8s.eventually(lambda: status_of(k8s, "statusy").get("phase") == "Progressing", WAIT_S)
    assert condition(k8s, "statusy", "Ready") == ("False", "ReplicasNotReady")
    set_deployment_status(k8s, "statusy", replicas=2, ready=2)
    k8s.eventually(lambda: status_of(k8s, "statusy").get("phase") == "Ready", WAIT_S)
    assert status_of(k8s, "statusy")["readyReplicas"] == 2
    assert condition(k8s, "statusy", "Ready") == ("True", "AllReplicasReady")
    assert condition(k8s, "statusy", "Progressing") == ("False", "Complete")
    set_deployment_status(k8s, "statusy", replicas=2, ready=1)
    k8s.eventually(lambda: status_of(k8s, "statusy").get("phase") == "Degraded", WAIT_S)
    assert status_of(k8s, "statusy")["readyReplicas"] == 1
    assert condition(k8s, "statusy", "Degraded") == ("True", "ReplicasLost")
    assert condition(k8s, "statusy", "Ready") == ("False", "ReplicasNotReady")


def test_autoscaler_fields_in_status_survive_reconciles(cluster):
    k8s, _ = cluster
    k8s.create(tiny("shared-status"))
    k8s.eventually(lambda: status_of(k8s, "shared-status").get("phase"), WAIT_S)
    scaling = {"type": "ScalingActive", "status": "False", "reason": "MetricsUnavailable", "message": "no data",
               "lastTransitionTime": "2026-01-01T00:00:00Z"}
    current = status_of(k8s, "shared-status")
    k8s.patch(*IM, "shared-status", "default", {"status": {
        "conditions": [*current["conditions"], scaling], "autoscaler": {"queueDepth": 7, "lastDecision": "hold"}}},
        subresource="status")
    k8s.patch(*IM, "shared-status", "default", {"spec": {"server": {"maxNumSeqs": 4}}})  # forces a reconcile
    k8s.eventually(lambda: status_of(k8s, "shared-status").get("observedGeneration") == 2, WAIT_S)
    time.sleep(DRIFT_S)  # and a drift tick
    status = status_of(k8s, "shared-status")
    assert scaling in status["conditions"] and status["autoscaler"]["queueDepth"] == 7


def test_scale_subresource_drives_the_deployment_within_bounds(cluster):
    k8s, _ = cluster
    k8s.create(tiny("scaled"))
    wait_deployment(k8s, "scaled")
    k8s.patch(*IM, "scaled", "default", {"spec": {"replicas": 2}}, subresource="scale")
    wait_deployment(k8s, "scaled", lambda d: d["spec"]["replicas"] == 2)
    k8s.patch(*IM, "scaled", "default", {"spec": {"replicas": 9}}, subresource="scale")  # above maxReplicas 2
    wait_deployment(k8s, "scaled", lambda d: d["spec"]["replicas"] == 2)
    k8s.eventually(lambda: status_of(k8s, "scaled").get("desiredReplicas") == 2, WAIT_S)


def test_unhonourable_spec_is_degraded_not_crash_looped(cluster):
    k8s, _ = cluster
    obj = tiny("no-claim")
    obj["spec"]["model"]["source"] = {"pvc": {"claimName": "missing-claim"}}
    k8s.create(obj)
    k8s.eventually(lambda: condition(k8s, "no-claim", "Degraded") == ("True", "ClaimNotFound"), WAIT_S)
    degraded = next(c for c in status_of(k8s, "no-claim")["conditions"] if c["type"] == "Degraded")
    assert 'PersistentVolumeClaim "missing-claim" does not exist in namespace "default"' in degraded["message"]
    assert status_of(k8s, "no-claim")["phase"] == "Degraded"
    assert k8s.get(*DEPLOYMENTS, "no-claim", "default") is None  # no pods that cannot start
    warnings = [e for e in k8s.list("v1", "events", "default")
                if e["involvedObject"]["name"] == "no-claim" and e["type"] == "Warning"]
    assert warnings and warnings[0]["reason"] == "ClaimNotFound"
    k8s.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "missing-claim", "namespace": "default"}, "spec": {}})
    wait_deployment(k8s, "no-claim")  # the drift timer notices the claim
    k8s.eventually(lambda: condition(k8s, "no-claim", "Degraded") == ("False", "AsExpected"), WAIT_S)


def test_a_stored_deprecated_field_keeps_reconciling_with_one_event(cluster):
    k8s, _ = cluster
    k8s.create(tiny("old-kv", server={"kvCacheMemoryFraction": 0.25}))
    first = wait_deployment(k8s, "old-kv")
    kv_bytes = args_of(first)[args_of(first).index("--kv-cache-memory") + 1]  # mapped as before, for one release
    assert int(kv_bytes) > 0 and "--gpu-memory-utilization" not in args_of(first)
    k8s.patch(*IM, "old-kv", "default", {"spec": {"server": {"maxNumSeqs": 16}}})  # a second full reconcile
    wait_deployment(k8s, "old-kv", lambda d: args_of(d)[args_of(d).index("--max-num-seqs") + 1] == "16")
    k8s.eventually(lambda: status_of(k8s, "old-kv").get("observedGeneration") == 2, WAIT_S)
    time.sleep(2 * DRIFT_S)  # and the drift timer's reconciles
    assert condition(k8s, "old-kv", "Degraded") == ("False", "AsExpected")
    assert condition(k8s, "old-kv", "Deprecated") == ("True", "DeprecatedField")
    events = [e for e in k8s.list("v1", "events", "default")
              if e["involvedObject"]["name"] == "old-kv" and e["reason"] == "DeprecatedField"]
    assert len(events) == 1 and "gpuMemoryUtilization" in events[0]["message"], events
    assert events[0]["type"] == "Warning"


def test_a_served_name_taken_by_an_older_model_is_a_name_conflict(cluster):
    k8s, _ = cluster
    older = tiny("first-llama")  # in team-b, which this operator does not watch; the gateway does
    older["metadata"]["namespace"] = "team-b"
    older["spec"]["model"]["name"] = "llama"
    k8s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
    k8s.create(older)
    time.sleep(1.1)  # creationTimestamp has one-second resolution
    later = tiny("second-llama")
    later["spec"]["model"]["name"] = "llama"
    k8s.create(later)
    k8s.eventually(lambda: condition(k8s, "second-llama", "Degraded") == ("True", "ModelNameConflict"), WAIT_S)
    degraded = next(c for c in status_of(k8s, "second-llama")["conditions"] if c["type"] == "Degraded")
    assert "team-b/first-llama" in degraded["message"] and "change spec.model.name" in degraded["message"]
    wait_deployment(k8s, "second-llama")  # its pods still run: its own Service reaches them
    k8s.delete(*IM, "first-llama", "team-b")
    k8s.eventually(lambda: condition(k8s, "second-llama", "Degraded") == ("False", "AsExpected"), WAIT_S)
    k8s.delete(*IM, "second-llama", "default")


def test_deleting_the_model_leaves_nothing_behind(cluster):
    k8s, _ = cluster
    obj = tiny("short-lived")
    obj["spec"]["placement"] = {"policy": "latency-first"}  # with a PDB too
    k8s.create(obj)
    k8s.eventually(lambda: k8s.get("policy/v1", "poddisruptionbudgets", "short-lived", "default"), WAIT_S)
    wait_deployment(k8s, "short-lived")
    k8s.delete(*IM, "short-lived", "default")
    k8s.eventually(lambda: k8s.get(*IM, "short-lived", "default") is None, WAIT_S, message="finalizer released")
    selector = "app.kubernetes.io/instance=short-lived"
    for api_version, plural in (DEPLOYMENTS, ("v1", "services"), ("policy/v1", "poddisruptionbudgets")):
        assert k8s.list(api_version, plural, "default", labels=selector) == []


def test_switching_to_cost_first_removes_the_pdb(cluster):
    k8s, _ = cluster
    obj = tiny("switcher")
    obj["spec"]["placement"] = {"policy": "latency-first"}
    k8s.create(obj)
    k8s.eventually(lambda: k8s.get("policy/v1", "poddisruptionbudgets", "switcher", "default"), WAIT_S)
    k8s.patch(*IM, "switcher", "default", {"spec": {"placement": {"policy": "cost-first"}}})
    k8s.eventually(lambda: k8s.get("policy/v1", "poddisruptionbudgets", "switcher", "default") is None, WAIT_S)


def test_health_and_metrics_endpoints(cluster):
    _, op = cluster
    assert op.healthy()
    text = httpx.get(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).text
    assert 'flotilla_operator_reconciles_total{resource="inferencemodel"}' in text
    assert 'flotilla_operator_max_replicas{model="tiny",namespace="default"} 2.0' in text


def test_killed_mid_reconcile_then_restarted_converges_without_duplicates(tmp_path):
    with serve(tmp_path, crds=[crd()], monitoring=True) as k8s:
        k8s.emulator.delays_s["POST deployments"] = 3.0  # the operator is killed while this is in flight
        with operator_process(k8s.kubeconfig, tmp_path, "--drift-interval-s", str(DRIFT_S)) as first:
            k8s.create(tiny("phoenix"))
            k8s.eventually(lambda: k8s.get("v1", "services", "phoenix", "default"), WAIT_S)
            time.sleep(0.5)
            assert k8s.get(*DEPLOYMENTS, "phoenix", "default") is None  # mid-reconcile
            first.kill()
        k8s.emulator.delays_s.clear()
        with operator_process(k8s.kubeconfig, tmp_path, "--drift-interval-s", str(DRIFT_S)):
            wait_deployment(k8s, "phoenix")
            k8s.eventually(lambda: k8s.get("monitoring.coreos.com/v1", "servicemonitors", "phoenix", "default"), WAIT_S)
            k8s.eventually(lambda: status_of(k8s, "phoenix").get("phase") == "Progressing", WAIT_S)
            time.sleep(DRIFT_S + 1)  # a drift tick after convergence must not add anything
            selector = "app.kubernetes.io/instance=phoenix"
            for api_version, plural in (DEPLOYMENTS, ("v1", "services"), ("monitoring.coreos.com/v1", "servicemonitors")):
                assert len(k8s.list(api_version, plural, "default", labels=selector)) == 1, plural


def test_transient_api_errors_are_retried_with_backoff(tmp_path):
    with serve(tmp_path, crds=[crd()]) as k8s:
        k8s.emulator.failures["POST deployments"] = 2  # two 503s: retried after 1 s, then 2 s
        with operator_process(k8s.kubeconfig, tmp_path, "--drift-interval-s", "60") as op:
            k8s.create(tiny("flaky"))
            wait_deployment(k8s, "flaky")
            assert k8s.emulator.failures["POST deployments"] == 0
            assert "retrying" in op.log()
            k8s.eventually(lambda: status_of(k8s, "flaky").get("phase") == "Progressing", WAIT_S)


# Granted for code paths this test does not drive: the autoscalers' scale writes (test_autoscaler_loop,
# test_pool_autoscaler_loop and the e2e suite drive them) and kopf peering (only with --peering).
RESERVED = {("patch", "flotilla.dev", "inferencemodels/scale"), ("patch", "flotilla.dev", "modelpools/scale")} | {
    (verb, "kopf.dev", resource) for verb in ("get", "list", "watch", "patch")
    for resource in ("clusterkopfpeerings", "kopfpeerings")}


def _granted(rules):
    return {(verb, group, resource) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_deploy_rbac_grants_exactly_what_the_operator_uses(tmp_path):
    with serve(tmp_path, crds=[crd(), pool_crd()], monitoring=True) as k8s, \
            operator_process(k8s.kubeconfig, tmp_path, "--drift-interval-s", str(DRIFT_S)):
        k8s.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "models", "namespace": "default"}, "spec": {}})
        obj = tiny("audited", placement={"policy": "latency-first"})
        obj["spec"]["model"]["source"] = {"pvc": {"claimName": "models"}}
        obj["spec"]["networkPolicy"] = {"enabled": True}
        k8s.create(obj)
        wait_deployment(k8s, "audited")
        children = (("v1", "services"), ("policy/v1", "poddisruptionbudgets"), ("monitoring.coreos.com/v1", "servicemonitors"),
                    ("networking.k8s.io/v1", "networkpolicies"))
        for api_version, plural in children:
            k8s.eventually(lambda a=api_version, p=plural: k8s.get(a, p, "audited", "default"), WAIT_S)
            k8s.patch(api_version, plural, "audited", "default", {"metadata": {"labels": {"app.kubernetes.io/version": "x"}}})
        for api_version, plural in children:  # drift: each child replaced back
            k8s.eventually(lambda a=api_version, p=plural: k8s.get(a, p, "audited", "default")["metadata"]["labels"]
                           ["app.kubernetes.io/version"] == "0.1.0", WAIT_S)
        k8s.patch(*IM, "audited", "default", {"spec": {"server": {"maxNumSeqs": 4}, "placement": {"policy": "cost-first"},
                                                        "networkPolicy": {"enabled": False}}})
        k8s.eventually(lambda: k8s.get("policy/v1", "poddisruptionbudgets", "audited", "default") is None, WAIT_S)
        k8s.eventually(lambda: k8s.get("networking.k8s.io/v1", "networkpolicies", "audited", "default") is None, WAIT_S)
        # An adapter (docs/operator.md, "Adapters"): its list ConfigMap appears, and goes with the last adapter.
        k8s.patch(*IM, "audited", "default", {"spec": {"adapters": [
            {"name": "legal", "source": {"pvc": {"claimName": "models", "path": "adapters/legal"}}}]}})
        k8s.eventually(lambda: k8s.get("v1", "configmaps", "audited-adapters", "default"), WAIT_S)
        k8s.patch(*IM, "audited", "default", {"spec": {"adapters": []}})
        k8s.eventually(lambda: k8s.get("v1", "configmaps", "audited-adapters", "default") is None, WAIT_S)
        # A ModelPool (docs/pools.md): the model joins it, giving up its Deployment; the members ConfigMap drifts back.
        k8s.create({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelPool",
                    "metadata": {"name": "shared", "namespace": "default"}, "spec": {"volume": {"claimName": "models"}}})
        k8s.patch(*IM, "audited", "default", {"spec": {"pool": "shared"}})
        k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "audited", "default") is None, WAIT_S)
        k8s.eventually(lambda: k8s.get("v1", "configmaps", "shared-pool-members", "default"), WAIT_S)
        k8s.patch("v1", "configmaps", "shared-pool-members", "default", {"data": {"models": "edited by hand\n"}})
        k8s.eventually(lambda: k8s.get("v1", "configmaps", "shared-pool-members", "default")["data"]["models"]
                       == "audited=/models\n", WAIT_S)  # the served name (tiny() names it after the model)
        k8s.delete(*IM, "audited", "default")
        k8s.eventually(lambda: k8s.get(*IM, "audited", "default") is None, WAIT_S)
        audit = list(k8s.emulator.audit)
    rules = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()) if d["kind"] == "ClusterRole")["rules"]
    used = {(e.verb, e.group, e.resource) for e in audit if not e.user_agent.startswith("python-httpx")}  # not the test's
    denied = sorted(u for u in used if not allows(rules, *u))
    assert denied == [], f"deploy/rbac.yaml lacks: {denied}"
    unused = sorted(_granted(rules) - used - RESERVED)
    assert unused == [], f"deploy/rbac.yaml grants more than the operator uses: {unused}"


def test_all_namespaces_mode_reconciles_any_namespace(tmp_path):
    with serve(tmp_path, crds=[crd()], namespaces=("default", "team-a")) as k8s, \
            operator_process(k8s.kubeconfig, tmp_path, namespace=None):
        obj = tiny("elsewhere")
        obj["metadata"]["namespace"] = "team-a"
        k8s.create(obj)
        deployment = k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "elsewhere", "team-a"), WAIT_S)
        assert deployment["metadata"]["namespace"] == "team-a"
        k8s.eventually(lambda: (k8s.get(*IM, "elsewhere", "team-a").get("status") or {}).get("endpoint")
                       == "http://elsewhere.team-a.svc.cluster.local:8000/v1", WAIT_S)
