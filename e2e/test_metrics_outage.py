"""With Prometheus down the fleet holds and says why; when Prometheus returns, scaling resumes.

The model starts at 2 replicas with no load: with metrics, the autoscaler would scale it to 1 one
window after its first decision. Prometheus is stopped right after that first decision; the fleet
must hold 2 well past the window, with ScalingActive False/MetricsUnavailable; once Prometheus is
back, the condition recovers and the scale-down happens.
"""

from __future__ import annotations

import time

from e2e.conftest import AUTOSCALE_INTERVAL_S
from e2e.harness import Loop, Recorder, inference_model

NAME = "outage"
WINDOW_S = 8  # scaleDownStabilizationSeconds
OUTAGE_S = WINDOW_S + 4 * AUTOSCALE_INTERVAL_S


def test_outage_holds_replicas_and_recovers(loop: Loop) -> None:
    loop.apply(inference_model(NAME, "cost-first", replicas=2, minReplicas=1, maxReplicas=3,
                               scaleDownStabilizationSeconds=WINDOW_S))
    try:
        with Recorder(loop.k8s.url, NAME) as recorder:
            # The first decision remembers 2 and starts the window; the outage must begin inside it.
            loop.wait(lambda: loop.condition(NAME, "ScalingActive").get("status") == "True", 30, "a first decision")
            window_start = time.monotonic()
            loop.prometheus.stop()
            assert time.monotonic() - window_start < WINDOW_S / 2, "Prometheus took too long to stop"
            try:
                loop.wait(lambda: loop.condition(NAME, "ScalingActive").get("reason") == "MetricsUnavailable",
                          3 * AUTOSCALE_INTERVAL_S + 2, "ScalingActive False/MetricsUnavailable")
                assert loop.condition(NAME, "ScalingActive")["status"] == "False"
                time.sleep(max(window_start + OUTAGE_S - time.monotonic(), 0))
                assert loop.condition(NAME, "ScalingActive")["reason"] == "MetricsUnavailable"
                assert loop.model(NAME)["status"]["autoscaler"]["lastReason"] == "MetricsUnavailable"
            finally:
                outage_end = time.monotonic()  # before start(): a decision may land while Prometheus starts
                loop.prometheus.start()
            loop.wait(lambda: loop.condition(NAME, "ScalingActive").get("status") == "True",
                      3 * AUTOSCALE_INTERVAL_S + 5, "ScalingActive again")
            loop.wait(lambda: loop.replicas(NAME) == 1, WINDOW_S + 4 * AUTOSCALE_INTERVAL_S + 5, "scaling resumed")
        held = recorder.between(0, outage_end)
        assert held and set(held) == {2}, held  # from creation to the end of the outage, well past the window
        warnings = [e for e in loop.k8s.list("v1", "events", "default")
                    if e.get("reason") == "MetricsUnavailable" and e["involvedObject"]["name"] == NAME]
        assert warnings and warnings[0]["type"] == "Warning"
    finally:
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, 30, "servers of the deleted model stopped")
