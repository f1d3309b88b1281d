"""With Prometheus down the fleet holds and says why; when Prometheus returns, scaling resumes.

The model starts at 2 replicas with no load: with metrics, the autoscaler would scale it to 1 after
the window. While Prometheus is stopped it must hold 2, well past that window, with ScalingActive
False/MetricsUnavailable; once Prometheus is back, the condition recovers and the scale-down happens.
"""

from __future__ import annotations

import time

from e2e.conftest import AUTOSCALE_INTERVAL_S
from e2e.harness import Loop, Recorder, inference_model

NAME = "outage"
WINDOW_S = 4  # scaleDownStabilizationSeconds
OUTAGE_S = WINDOW_S + 4 * AUTOSCALE_INTERVAL_S


def test_outage_holds_replicas_and_recovers(loop: Loop) -> None:
    loop.apply(inference_model(NAME, "cost-first", replicas=2, minReplicas=1, maxReplicas=3,
                               scaleDownStabilizationSeconds=WINDOW_S))
    try:
        loop.wait(lambda: len(loop.runner.endpoints(NAME)) == 2, 60, "two replicas serving")
        loop.wait(lambda: loop.condition(NAME, "ScalingActive").get("status") == "True", 20, "ScalingActive")
        loop.prometheus.stop()
        try:
            with Recorder(loop.k8s.url, NAME) as held:
                loop.wait(lambda: loop.condition(NAME, "ScalingActive").get("reason") == "MetricsUnavailable",
                          3 * AUTOSCALE_INTERVAL_S + 2, "ScalingActive False/MetricsUnavailable")
                assert loop.condition(NAME, "ScalingActive")["status"] == "False"
                time.sleep(OUTAGE_S)
            assert held.samples and {s.replicas for s in held.samples} == {2}
            assert loop.condition(NAME, "ScalingActive")["reason"] == "MetricsUnavailable"
            assert loop.model(NAME)["status"]["autoscaler"]["lastReason"] == "MetricsUnavailable"
            warnings = [e for e in loop.k8s.list("v1", "events", "default")
                        if e.get("reason") == "MetricsUnavailable" and e["involvedObject"]["name"] == NAME]
            assert warnings and warnings[0]["type"] == "Warning"
        finally:
            loop.prometheus.start()
        loop.wait(lambda: loop.condition(NAME, "ScalingActive").get("status") == "True",
                  3 * AUTOSCALE_INTERVAL_S + 5, "ScalingActive again")
        loop.wait(lambda: loop.replicas(NAME) == 1, WINDOW_S + 4 * AUTOSCALE_INTERVAL_S + 5, "scaling resumed")
    finally:
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, 30, "servers of the deleted model stopped")
