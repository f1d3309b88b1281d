"""With Prometheus down the fleet holds and says why; when Prometheus returns, scaling resumes.

The model starts at 2 replicas with no load: with metrics, the autoscaler would scale it to 1 one
window after its first decision. Prometheus is stopped right after that first decision; the fleet
must hold 2 well past the window, with ScalingActive False/MetricsUnavailable; once Prometheus is
back, the condition recovers and the scale-down happens.

Times come from the operator's records (the first recommendation's time, the condition's
lastTransitionTime, lastScaleTime) and from clocks read at the moment Prometheus was gone or back,
never from when a wait returned: waits have deadlines that only a hang reaches.
"""

from __future__ import annotations

import time

from e2e.conftest import AUTOSCALE_INTERVAL_S, SETTLE_S
from e2e.harness import Loop, Recorder, epoch, inference_model

NAME = "outage"
WINDOW_S = 8  # scaleDownStabilizationSeconds
OUTAGE_S = WINDOW_S + 4 * AUTOSCALE_INTERVAL_S  # from the first decision to Prometheus' return


def since(loop: Loop, status: str) -> float | None:
    """When ScalingActive last turned `status`, as the operator recorded it."""
    condition = loop.condition(NAME, "ScalingActive")
    return epoch(condition["lastTransitionTime"]) if condition.get("status") == status else None


def test_outage_holds_replicas_and_recovers(loop: Loop) -> None:
    loop.apply(inference_model(NAME, "cost-first", replicas=2, minReplicas=1, maxReplicas=3,
                               scaleDownStabilizationSeconds=WINDOW_S))
    try:
        with Recorder(loop.k8s.url, NAME) as recorder:
            # The first decision remembers 2 and starts the window; the outage must begin inside it.
            first = loop.wait(lambda: (loop.model(NAME).get("status") or {}).get("autoscaler", {}).get("recommendations"),
                              SETTLE_S, "a first decision")
            window_start = epoch(first[0]["time"])
            loop.prometheus.stop()
            stopped = time.time()  # Prometheus has exited: no query after this can succeed
            # a precondition, not the product's timing: no decision at the window's end may have read metrics
            assert stopped < window_start + WINDOW_S - AUTOSCALE_INTERVAL_S, "Prometheus stopped too late to test"
            try:
                unavailable = loop.wait(lambda: loop.condition(NAME, "ScalingActive").get("reason") == "MetricsUnavailable"
                                        and since(loop, "False"), SETTLE_S, "ScalingActive False/MetricsUnavailable")
                assert unavailable - stopped <= 3 * AUTOSCALE_INTERVAL_S + 2, unavailable - stopped
                time.sleep(max(window_start + OUTAGE_S - time.time(), 0))
                assert loop.condition(NAME, "ScalingActive")["reason"] == "MetricsUnavailable"
                assert loop.model(NAME)["status"]["autoscaler"]["lastReason"] == "MetricsUnavailable"
                assert loop.replicas(NAME) == 2  # well past the window
            finally:
                outage_end = time.monotonic()  # before start(): a decision may land while Prometheus starts
                loop.prometheus.start()
                restarted = time.time()  # Prometheus answers /-/ready: metrics are back no later than this
            recovered = loop.wait(lambda: since(loop, "True"), SETTLE_S, "ScalingActive again")
            assert recovered - restarted <= 3 * AUTOSCALE_INTERVAL_S + 5, recovered - restarted
            loop.wait(lambda: loop.replicas(NAME) == 1, SETTLE_S, "scaling resumed")
        down = epoch(loop.wait(lambda: loop.model(NAME)["status"]["autoscaler"].get("lastScaleTime"), SETTLE_S,
                               "the scale-down recorded in status"))
        assert down - restarted <= WINDOW_S + 4 * AUTOSCALE_INTERVAL_S + 5, down - restarted
        held = recorder.between(0, outage_end)
        assert held and set(held) == {2}, held  # from creation to the end of the outage,
        assert any(s.epoch_s > window_start + WINDOW_S for s in recorder.samples if s.t_s <= outage_end)  # past the window
        warnings = loop.events(NAME, "MetricsUnavailable")
        assert warnings and warnings[0]["type"] == "Warning"
    finally:
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, SETTLE_S, "servers of the deleted model stopped")
