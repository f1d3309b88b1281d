"""Pod failures reach `kubectl get im`: the real operator against the emulator, pods set as the kubelet would.

For each failure (all six at once, a model each) the test creates a pod of the model (the Deployment's template labels), writes its
status through the status subresource, and expects the Degraded condition with that reason, the
printer columns showing it, one Warning Event, and the condition cleared once the pod recovers.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from flotilla_operator.rfc3339 import format_time

from tests.support.examples import crd
from tests.support.k8s_emulator import serve
from tests.support.operator_process import operator_process

WAIT_S = 15.0
IM = ("flotilla.dev/v1alpha1", "inferencemodels")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pods")
    with serve(directory, crds=[crd()]) as k8s, operator_process(k8s.kubeconfig, directory, "--drift-interval-s", "2"):
        yield k8s


def columns(obj: dict[str, Any]) -> dict[str, Any]:
    """What `kubectl get im` prints for `obj`: the CRD's printer columns, their JSON paths followed."""
    version = crd()["spec"]["versions"][0]
    out = {}
    for column in version["additionalPrinterColumns"]:
        node: Any = obj
        for part in column["jsonPath"].strip(".").split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[column["name"]] = node
    return out


def ago(seconds: float) -> str:
    return format_time(time.time() - seconds)


FAILURES = {
    "ImagePullBackOff": {"containerStatuses": [{"name": "server", "ready": False, "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "ghcr.io/nope:9"'}}}]},
    "CreateContainerConfigError": {"containerStatuses": [{"name": "server", "ready": False, "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}}}]},
    "CrashLoopBackOff": {"containerStatuses": [{"name": "server", "ready": False, "restartCount": 3, "state": {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]},
    "OOMKilled": {"containerStatuses": [{"name": "server", "ready": False, "restartCount": 2, "state": {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]},
    "Unschedulable": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                      "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                                      "lastTransitionTime": ago(600)}]},
    "StartupProbeFailing": {"containerStatuses": [{"name": "server", "ready": False, "started": False,
                                                   "state": {"running": {"startedAt": ago(3600)}}}]},
}
HEALTHY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
           "containerStatuses": [{"name": "server", "ready": True, "started": True,
                                  "state": {"running": {"startedAt": ago(10)}}}]}


def degraded(k8s, name: str) -> dict[str, Any] | None:
    for condition in ((k8s.get(*IM, name, "default") or {}).get("status") or {}).get("conditions") or []:
        if condition["type"] == "Degraded" and condition["status"] == "True":
            return condition
    return None


def test_each_failing_pod_shows_in_status_columns_and_one_event(cluster):
    """All six failures at once, one model each: one operator, one wait for two drift ticks."""
    k8s = cluster
    pods = {}
    for reason in FAILURES:
        name = f"pf-{reason.lower()}"
        k8s.create({"apiVersion": IM[0], "kind": "InferenceModel", "metadata": {"name": name, "namespace": "default"},
                    "spec": {"model": {"name": name, "source": {"builtin": "tiny"}}}})
        pods[reason] = (name, f"{name}-7d9f-x1")
    for reason, (name, pod_name) in pods.items():
        deployment = k8s.eventually(lambda name=name: k8s.get("apps/v1", "deployments", name, "default"), WAIT_S)
        template = deployment["spec"]["template"]
        k8s.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "namespace": "default",
                    "labels": template["metadata"]["labels"]}, "spec": template["spec"]})
        k8s.patch("v1", "pods", pod_name, "default", {"status": {"phase": "Pending", **FAILURES[reason]}},
                  subresource="status")

    for reason, (name, pod_name) in pods.items():
        condition = k8s.eventually(lambda name=name: degraded(k8s, name), WAIT_S, message=f"Degraded/{reason}")
        assert condition["reason"] == reason, (reason, condition)
        assert condition["message"].startswith(f"1/1 pods: {reason} ({pod_name})"), condition
        shown = columns(k8s.get(*IM, name, "default"))
        assert shown["Phase"] == "Degraded" and shown["Message"].startswith(f"1/1 pods: {reason}"), shown
    time.sleep(5)  # two drift ticks and more pod events: still one Event each
    for _, pod_name in pods.values():
        k8s.patch("v1", "pods", pod_name, "default", {"metadata": {"labels": {"touched": "yes"}}})
    time.sleep(1)
    events = k8s.list("v1", "events", "default")
    for reason, (name, _) in pods.items():
        mine = [e for e in events if e["involvedObject"]["name"] == name and e["reason"] == reason]
        assert len(mine) == 1 and mine[0]["type"] == "Warning", (reason, mine)

    for _, pod_name in pods.values():
        k8s.patch("v1", "pods", pod_name, "default", {"status": HEALTHY}, subresource="status")
    for reason, (name, _) in pods.items():
        k8s.eventually(lambda name=name: degraded(k8s, name) is None, WAIT_S, message=f"Degraded/{reason} cleared")
        assert not columns(k8s.get(*IM, name, "default"))["Message"].startswith("1/1 pods")
        k8s.delete(*IM, name, "default")
