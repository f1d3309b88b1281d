"""pod_health: each kubelet and scheduler failure maps to one reason with what to change; pods aggregate."""

from __future__ import annotations

import pytest
from flotilla_operator.pod_health import REASONS, pod_failure, summarize
from flotilla_operator.rfc3339 import format_time
from hypothesis import given
from hypothesis import strategies as st

NOW_S = 1_800_000_000.0
STARTUP = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 12}


def pod(name: str = "m-abc", container: dict | None = None, conditions: list | None = None,
        deleting: bool = False) -> dict:
    meta = {"name": name, **({"deletionTimestamp": format_time(NOW_S)} if deleting else {})}
    status = {"phase": "Pending", "conditions": conditions or []}
    if container is not None:
        status["containerStatuses"] = [{"name": "server", "ready": False, **container}]
    return {"metadata": meta, "spec": {"containers": [{"name": "server", "startupProbe": STARTUP}]}, "status": status}


def waiting(reason: str, message: str = "") -> dict:
    return {"state": {"waiting": {"reason": reason, "message": message}}}


def unschedulable(age_s: float) -> list:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
             "lastTransitionTime": format_time(NOW_S - age_s)}]


def running(age_s: float, started: bool) -> dict:
    return {"state": {"running": {"startedAt": format_time(NOW_S - age_s)}}, "started": started}


OOM_THEN_BACKOFF = {"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}


@pytest.mark.parametrize(("the_pod", "reason", "words"), [
    pytest.param(pod(container=waiting("ImagePullBackOff", 'Back-off pulling image "x:9"')), "ImagePullBackOff",
                 ['Back-off pulling image "x:9"', "spec.image"], id="image pull back-off"),
    pytest.param(pod(container=waiting("ErrImagePull", "not found")), "ImagePullBackOff", ["not found"], id="first pull error"),
    pytest.param(pod(container=waiting("CreateContainerConfigError", 'secret "hf" not found')),
                 "CreateContainerConfigError", ['secret "hf" not found', "tokenSecret"], id="missing secret"),
    pytest.param(pod(container=waiting("CrashLoopBackOff", "back-off 10s")), "CrashLoopBackOff",
                 ["back-off 10s", "kubectl logs --previous"], id="crash loop"),
    pytest.param(pod(container=OOM_THEN_BACKOFF), "OOMKilled", ["spec.resources.memory"], id="OOM explains the back-off"),
    pytest.param(pod(container={"state": {"terminated": {"reason": "OOMKilled"}}}), "OOMKilled", ["memory"], id="OOM now"),
    pytest.param(pod(conditions=unschedulable(121)), "Unschedulable", ["Insufficient nvidia.com/gpu", "spec.resources"],
                 id="unschedulable past the grace"),
    pytest.param(pod(container=running(121, started=False)), "StartupProbeFailing", ["startup probe", "120s"],
                 id="startup probe never passes"),
])
def test_each_failure_has_its_reason_and_says_what_to_change(the_pod, reason, words):
    failure = pod_failure(the_pod, NOW_S)
    assert failure is not None and failure.reason == reason and failure.pod == "m-abc"
    for word in words:
        assert word in failure.message


@pytest.mark.parametrize("the_pod", [
    pytest.param(pod(conditions=unschedulable(30)), id="unschedulable within the grace: a node may be on its way"),
    pytest.param(pod(container=running(60, started=False)), id="still within the startup budget"),
    pytest.param(pod(container=running(600, started=True)), id="started"),
    pytest.param(pod(container=waiting("ContainerCreating")), id="creating"),
    pytest.param(pod(container=waiting("ImagePullBackOff"), deleting=True), id="going away"),
    pytest.param(pod(), id="no status yet"),
])
def test_normal_states_are_not_failures(the_pod):
    assert pod_failure(the_pod, NOW_S) is None


def test_the_grace_is_a_parameter():
    assert pod_failure(pod(conditions=unschedulable(30)), NOW_S, unschedulable_grace_s=10).reason == "Unschedulable"


def test_pods_aggregate_with_the_commonest_reason_first():
    pods = [pod("m-1", waiting("ImagePullBackOff", "pull")), pod("m-2", waiting("ImagePullBackOff", "pull")),
            pod("m-3", OOM_THEN_BACKOFF), pod("m-4", running(600, started=True))]
    problem = summarize(pods, NOW_S)
    assert problem.reason == "ImagePullBackOff"
    assert problem.message.startswith("2/4 pods: ImagePullBackOff (m-1): container server: pull;")
    assert "1/4 pods: OOMKilled (m-3)" in problem.message


def test_a_tie_goes_to_the_more_specific_reason():
    pods = [pod("m-1", waiting("CrashLoopBackOff")), pod("m-2", OOM_THEN_BACKOFF)]
    assert summarize(pods, NOW_S).reason == "OOMKilled"


def test_healthy_pods_and_no_pods_are_no_problem():
    assert summarize([], NOW_S) is None
    assert summarize([pod(container=running(600, started=True))], NOW_S) is None


def test_the_message_does_not_change_while_the_failure_does_not():
    stuck = [pod(container=running(200, started=False))]
    assert summarize(stuck, NOW_S) == summarize(stuck, NOW_S + 60)  # no ticking counters: no status churn


container_states = st.sampled_from([waiting("ImagePullBackOff"), waiting("CrashLoopBackOff"), OOM_THEN_BACKOFF,
                                    waiting("CreateContainerConfigError"), running(600, True), running(500, False),
                                    waiting("ContainerCreating"), None])


@given(st.lists(st.tuples(container_states, st.booleans()), max_size=8))
def test_summary_counts_never_exceed_the_pods(states):
    pods = [pod(f"m-{i}", c, unschedulable(200) if u else None) for i, (c, u) in enumerate(states)]
    problem = summarize(pods, NOW_S)
    failing = [p for p in pods if pod_failure(p, NOW_S) is not None]
    assert (problem is None) == (not failing)
    if problem is not None:
        top = sum(1 for p in failing if pod_failure(p, NOW_S).reason == problem.reason)
        assert problem.reason in REASONS and problem.message.startswith(f"{top}/{len(pods)} pods: {problem.reason} (")
