"""The real operator against the Kubernetes emulator: ModelPools and their members (docs/pools.md).

Timing margins as in test_operator_integration.py: drift every 2 s, waits of several intervals that poll.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.server.http.server_process import run_server
from tests.support.examples import crd, pool_crd
from tests.support.k8s_emulator import EmulatorHandle, serve
from tests.support.operator_process import operator_process

DRIFT_S = 2.0
WAIT_S = 20.0
IM = ("flotilla.dev/v1alpha1", "inferencemodels")
MP = ("flotilla.dev/v1alpha1", "modelpools")
DEPLOYMENTS = ("apps/v1", "deployments")
CONFIGMAPS = ("v1", "configmaps")
NS = "default"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pool-cluster")
    with serve(directory, crds=[crd(), pool_crd()]) as k8s:
        k8s.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "models", "namespace": NS}, "spec": {}})
        with operator_process(k8s.kubeconfig, directory, "--drift-interval-s", str(DRIFT_S)) as op:
            yield k8s, op


def pool(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelPool", "metadata": {"name": name, "namespace": NS},
            "spec": {"volume": {"claimName": "models"}, "memoryBudget": "1Gi", **spec}}


def model(name: str, source: dict[str, Any] | None = None, pool_name: str | None = "shared",
          policy: str = "cost-first", served_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": served_name or name, "source": source or {"builtin": "tiny"}},
                            "placement": {"policy": policy},
                            "scaling": {"minReplicas": 0 if policy == "cost-first" else 1}}
    if pool_name:
        spec["pool"] = pool_name
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceModel",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def members_file(k8s: EmulatorHandle, pool_name: str) -> str | None:
    configmap = k8s.get(*CONFIGMAPS, f"{pool_name}-pool-members", NS)
    return configmap["data"]["models"] if configmap else None


def status(k8s: EmulatorHandle, plural: tuple[str, str], name: str) -> dict[str, Any]:
    return (k8s.get(*plural, name, NS) or {}).get("status") or {}


def degraded(k8s: EmulatorHandle, name: str) -> tuple[str, str] | None:
    for c in status(k8s, IM, name).get("conditions", []):
        if c["type"] == "Degraded" and c["status"] == "True":
            return c["reason"], c["message"]
    return None


def test_a_pool_serves_its_members_and_membership_restarts_nothing(cluster):
    k8s, _ = cluster
    k8s.create(pool("shared"))
    k8s.create(model("alpha"))
    k8s.create(model("chat", pool_name="shared", policy="latency-first"))
    k8s.eventually(lambda: members_file(k8s, "shared") == "alpha=tiny\n", WAIT_S, message="alpha in the members file")
    deployment = k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "shared-pool", NS), WAIT_S)
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "ModelPool"
    k8s.eventually(lambda: status(k8s, IM, "alpha").get("pool") == "shared", WAIT_S, message="alpha's status.pool")
    assert k8s.get(*DEPLOYMENTS, "alpha", NS) is None  # a member has no Deployment of its own
    service = k8s.get("v1", "services", "alpha", NS)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]  # its endpoint fronts the pool
    k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "chat", NS), WAIT_S, message="latency-first keeps its Deployment")

    k8s.create(model("beta", {"pvc": {"claimName": "models", "path": "beta"}}))
    k8s.eventually(lambda: members_file(k8s, "shared") == "alpha=tiny\nbeta=/models/beta\n", WAIT_S)
    k8s.delete(*IM, "alpha", NS)
    k8s.eventually(lambda: members_file(k8s, "shared") == "beta=/models/beta\n", WAIT_S, message="alpha left")
    k8s.eventually(lambda: status(k8s, MP, "shared").get("memberCount") == 1, WAIT_S)
    after = k8s.get(*DEPLOYMENTS, "shared-pool", NS)
    assert after["metadata"]["generation"] == deployment["metadata"]["generation"]  # no rollout, no restart
    assert after["spec"]["template"] == deployment["spec"]["template"]


def test_a_source_the_pool_cannot_load_is_degraded_with_how_to_fix_it(cluster):
    k8s, _ = cluster
    k8s.create(pool("hf-pool"))
    k8s.create(model("gamma", {"huggingface": {"repo": "org/gamma"}}, pool_name="hf-pool"))
    reason, message = k8s.eventually(lambda: degraded(k8s, "gamma"), WAIT_S, message="gamma Degraded")
    assert reason == "SourceNotPoolable" and "PersistentVolumeClaim 'models'" in message
    assert k8s.get(*DEPLOYMENTS, "gamma", NS) is None
    assert "pool" not in status(k8s, IM, "gamma")  # not a member: `kubectl get im` shows no pool
    k8s.eventually(lambda: members_file(k8s, "hf-pool") == "", WAIT_S)


def test_a_missing_pool_is_degraded(cluster):
    k8s, _ = cluster
    k8s.create(model("orphan", pool_name="nowhere"))
    reason, message = k8s.eventually(lambda: degraded(k8s, "orphan"), WAIT_S, message="orphan Degraded")
    assert reason == "PoolNotFound" and "create it, or remove spec.pool" in message


def test_a_member_whose_served_name_an_older_model_holds_does_not_join_until_the_holder_goes(cluster):
    k8s, _ = cluster
    k8s.create(pool("names"))
    k8s.create(model("name-holder", pool_name=None, served_name="llama"))  # dedicated, and older
    time.sleep(1.1)  # creationTimestamp has one-second resolution
    k8s.create(model("name-taker", pool_name="names", served_name="llama"))
    k8s.create(model("name-bystander", pool_name="names", served_name="qwen"))
    reason, message = k8s.eventually(lambda: degraded(k8s, "name-taker"), WAIT_S, message="name-taker Degraded")
    assert reason == "ModelNameConflict" and "default/name-holder" in message and "change spec.model.name" in message
    # the bystander's line shows a pool pass that saw name-taker, and left it out
    k8s.eventually(lambda: members_file(k8s, "names") == "qwen=tiny\n", WAIT_S, message="only name-bystander listed")
    assert "pool" not in status(k8s, IM, "name-taker")  # not a member: `kubectl get im` shows no pool
    k8s.eventually(lambda: [m["name"] for m in status(k8s, MP, "names").get("members", [])] == ["name-bystander"],
                   WAIT_S, message="the pool's status.members")  # written after the file
    k8s.delete(*IM, "name-holder", NS)
    k8s.eventually(lambda: members_file(k8s, "names") == "llama=tiny\nqwen=tiny\n", WAIT_S, message="name-taker joined")
    k8s.eventually(lambda: status(k8s, IM, "name-taker").get("pool") == "names" and degraded(k8s, "name-taker") is None,
                   WAIT_S, message="name-taker's conflict cleared")
    for name in ("name-taker", "name-bystander"):
        k8s.delete(*IM, name, NS)


def test_a_dedicated_model_whose_served_name_an_older_member_holds_is_a_name_conflict(cluster):
    k8s, _ = cluster
    k8s.create(pool("held"))
    k8s.create(model("pooled-first", pool_name="held", served_name="mistral"))
    k8s.eventually(lambda: members_file(k8s, "held") == "mistral=tiny\n", WAIT_S, message="pooled-first joined")
    time.sleep(1.1)  # creationTimestamp has one-second resolution
    k8s.create(model("dedicated-second", pool_name=None, served_name="mistral"))
    reason, message = k8s.eventually(lambda: degraded(k8s, "dedicated-second"), WAIT_S, message="dedicated-second Degraded")
    assert reason == "ModelNameConflict" and "default/pooled-first" in message
    k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "dedicated-second", NS), WAIT_S,
                   message="its pods still run, as any dedicated model's in a name conflict")
    assert members_file(k8s, "held") == "mistral=tiny\n" and degraded(k8s, "pooled-first") is None
    for name in ("dedicated-second", "pooled-first"):
        k8s.delete(*IM, name, NS)


def test_a_dedicated_model_that_joins_gives_up_its_deployment_and_the_pool_reports_for_it(cluster):
    k8s, _ = cluster
    k8s.create(pool("join"))
    k8s.create(model("delta", pool_name=None))
    k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "delta", NS), WAIT_S, message="delta's own Deployment")
    k8s.patch(*IM, "delta", NS, {"spec": {"pool": "join"}})
    k8s.eventually(lambda: members_file(k8s, "join") == "delta=tiny\n", WAIT_S, message="delta joined")
    k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "delta", NS) is None, WAIT_S, message="delta's Deployment deleted")
    pool_deployment = k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "join-pool", NS), WAIT_S)
    k8s.patch(*DEPLOYMENTS, "join-pool", NS, {"status": {
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
        "observedGeneration": pool_deployment["metadata"]["generation"]}}, subresource="status")
    k8s.eventually(lambda: status(k8s, IM, "delta").get("readyReplicas") == 1, WAIT_S, message="delta reports the pool")
    k8s.eventually(lambda: status(k8s, MP, "join").get("phase") == "Ready", WAIT_S)
    assert status(k8s, IM, "delta")["phase"] == "Ready"
    k8s.patch(*IM, "delta", NS, {"spec": {"pool": None}})  # leaving: its own Deployment again, out of the file
    k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "delta", NS), WAIT_S, message="delta's Deployment back")
    k8s.eventually(lambda: members_file(k8s, "join") == "", WAIT_S, message="delta left the file")
    k8s.eventually(lambda: "pool" not in status(k8s, IM, "delta"), WAIT_S, message="delta's status.pool cleared")


def test_status_reports_the_pods_holding_a_member_from_their_load_reports(cluster, tmp_path):
    k8s, _ = cluster
    k8s.create(pool("resident"))
    k8s.create(model("held", pool_name="resident", served_name="tiny"))  # the name the real server serves
    deployment = k8s.eventually(lambda: k8s.get(*DEPLOYMENTS, "resident-pool", NS), WAIT_S)
    with run_server("--max-num-seqs", "4", tmp_path=tmp_path) as server:  # a real server stands in for the pod
        port = int(server.base_url.rsplit(":", 1)[1])
        k8s.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "resident-pool-0", "namespace": NS, "labels": deployment["spec"]["selector"]["matchLabels"]},
            "spec": {"containers": [{"name": "server", "image": "flotilla-server",
                                     "ports": [{"name": "http", "containerPort": port}]}]}})
        k8s.patch("v1", "pods", "resident-pool-0", NS, {"status": {"phase": "Running", "podIP": "127.0.0.1"}},
                  subresource="status")
        k8s.eventually(lambda: status(k8s, MP, "resident").get("residentCount") == 1, WAIT_S, message="residentCount")
        k8s.eventually(lambda: status(k8s, IM, "held").get("residentPods") == ["resident-pool-0"], WAIT_S,
                       message="the member's residentPods")
    k8s.eventually(lambda: status(k8s, MP, "resident").get("residentCount") == 0, WAIT_S, message="the server stopped")
