"""Status policy: Deployment observations to phase and conditions, never clobbering others' fields."""

from __future__ import annotations

from flotilla_operator.status import Observed, Problem, compute_status, status_changed

ENDPOINT, SELECTOR = "http://m.default.svc.cluster.local:8000/v1", "app.kubernetes.io/instance=m"


def deployment(replicas: int, ready: int, updated: int | None = None, generation: int = 1, observed: int = 1) -> dict:
    return {"metadata": {"generation": generation}, "status": {
        "replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas if updated is None else updated,
        "observedGeneration": observed}}


def step(previous: dict | None, desired: int, dep: dict | None, problems=(), now: str = "t1") -> dict:
    return compute_status(Observed(3, desired, dep, tuple(problems), previous), ENDPOINT, SELECTOR, now)


def conditions(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_ready_replicas_zero_two_one():
    starting = step(None, 2, deployment(2, 0))
    assert starting["phase"] == "Progressing" and starting["readyReplicas"] == 0
    assert conditions(starting) == {"Ready": ("False", "ReplicasNotReady"), "Progressing": ("True", "Scaling"),
                                    "Degraded": ("False", "AsExpected")}
    ready = step(starting, 2, deployment(2, 2), now="t2")
    assert ready["phase"] == "Ready" and ready["readyReplicas"] == 2
    assert conditions(ready) == {"Ready": ("True", "AllReplicasReady"), "Progressing": ("False", "Complete"),
                                 "Degraded": ("False", "AsExpected")}
    lost = step(ready, 2, deployment(2, 1), now="t3")
    assert lost["phase"] == "Degraded" and lost["readyReplicas"] == 1
    assert conditions(lost) == {"Ready": ("False", "ReplicasNotReady"), "Progressing": ("False", "Complete"),
                                "Degraded": ("True", "ReplicasLost")}
    assert "1 of 2 replicas are ready" in next(c["message"] for c in lost["conditions"] if c["type"] == "Degraded")
    still = step(lost, 2, deployment(2, 1), now="t4")
    assert still["phase"] == "Degraded"
    recovered = step(still, 2, deployment(2, 2), now="t5")
    assert recovered["phase"] == "Ready"


def test_scale_up_from_ready_is_progress_not_degradation():
    ready = step(None, 2, deployment(2, 2))
    assert step(ready, 3, deployment(3, 2))["phase"] == "Progressing"


def test_rollout_of_a_new_spec_is_progressing():
    ready = step(None, 2, deployment(2, 2))
    rolling = step(ready, 2, deployment(3, 2, updated=1, generation=2, observed=2))
    assert rolling["phase"] == "Progressing"
    assert conditions(rolling)["Progressing"] == ("True", "RollingOut")
    unobserved = step(ready, 2, deployment(2, 2, generation=3, observed=2))
    assert unobserved["phase"] == "Progressing"


def test_pending_and_scaled_to_zero():
    assert step(None, 1, None)["phase"] == "Pending"
    zero = step(None, 0, deployment(0, 0))
    assert zero["phase"] == "ScaledToZero" and conditions(zero)["Ready"] == ("False", "ScaledToZero")
    assert step(None, 0, deployment(1, 1))["phase"] == "Progressing"  # still draining the last replica


def test_problems_degrade_with_their_message():
    problem = Problem("ClaimNotFound", 'PersistentVolumeClaim "models" does not exist')
    status = step(None, 1, None, [problem])
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == ("True", "ClaimNotFound", problem.message)


def test_others_conditions_and_transition_times_are_kept():
    scaling = {"type": "ScalingActive", "status": "False", "reason": "MetricsUnavailable", "message": "x",
               "lastTransitionTime": "t0"}
    first = step({"conditions": [scaling]}, 1, deployment(1, 0), now="t1")
    assert scaling in first["conditions"]
    second = step(first, 1, deployment(1, 0), now="t2")
    ready = next(c for c in second["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "t1"  # unchanged status keeps its transition time
    third = step(second, 1, deployment(1, 1), now="t3")
    assert next(c for c in third["conditions"] if c["type"] == "Ready")["lastTransitionTime"] == "t3"
    assert "autoscaler" not in third  # never written by this policy


def test_status_written_only_when_changed():
    first = step(None, 1, deployment(1, 1))
    assert status_changed(None, first)
    assert not status_changed({**first, "autoscaler": {"queueDepth": 3}}, step(first, 1, deployment(1, 1), now="t9"))


def test_pod_failures_degrade_and_show_in_the_message_column():
    failing = Problem("ImagePullBackOff", "2/2 pods: ImagePullBackOff (m-1): container server: back-off; check spec.image")
    status = compute_status(Observed(3, 2, deployment(2, 0), (), None, failing), ENDPOINT, SELECTOR, "t1")
    assert status["phase"] == "Degraded" and conditions(status)["Degraded"] == ("True", "ImagePullBackOff")
    assert status["message"] == "2/2 pods: ImagePullBackOff (m-1): container server: back-off"  # first clause
    spec_problem = Problem("ClaimNotFound", "no claim")
    both = compute_status(Observed(3, 2, deployment(2, 0), (spec_problem,), None, failing), ENDPOINT, SELECTOR, "t1")
    assert conditions(both)["Degraded"] == ("True", "ClaimNotFound")  # the spec's problem comes first
    recovered = compute_status(Observed(3, 2, deployment(2, 2), (), status, None), ENDPOINT, SELECTOR, "t2")
    assert recovered["phase"] == "Ready" and recovered["message"] == "2 of 2 replicas are ready"
    assert len(compute_status(Observed(3, 1, None, (Problem("X", "y" * 500),)), ENDPOINT, SELECTOR, "t")["message"]) == 100
