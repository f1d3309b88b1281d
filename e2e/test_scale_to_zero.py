"""Scale to zero is cost-first only: an idle cost-first model with min 0 goes to zero and reports
ScaledToZero, while an idle latency-first model beside it never drops below one replica."""

from __future__ import annotations

from e2e.conftest import AUTOSCALE_INTERVAL_S
from e2e.harness import Loop, Recorder, inference_model

COST, LATENCY = "zero-cost", "zero-latency"
IDLE_S = 6  # scaleToZeroAfterSeconds
WINDOW_S = 4  # scaleDownStabilizationSeconds


def test_cost_first_scales_to_zero_latency_first_keeps_one(loop: Loop) -> None:
    loop.apply(inference_model(COST, "cost-first", replicas=1, minReplicas=0, maxReplicas=2,
                               scaleToZeroAfterSeconds=IDLE_S, scaleDownStabilizationSeconds=WINDOW_S))
    loop.apply(inference_model(LATENCY, "latency-first", replicas=1, minReplicas=1, maxReplicas=2,
                               scaleToZeroAfterSeconds=IDLE_S, scaleDownStabilizationSeconds=WINDOW_S))
    try:
        with Recorder(loop.k8s.url, LATENCY) as latency:
            loop.wait(lambda: loop.replicas(COST) == 0, IDLE_S + WINDOW_S + 8 * AUTOSCALE_INTERVAL_S + 20,
                      "cost-first at zero")
            loop.wait(lambda: loop.model(COST)["status"].get("phase") == "ScaledToZero", 20, "phase ScaledToZero")
            loop.wait(lambda: loop.runner.processes(COST) == 0, 20, "its server stopped")
            events = [e for e in loop.k8s.list("v1", "events", "default") if e["involvedObject"]["name"] == COST
                      and e.get("reason") == "ScaleToZero"]
            assert len(events) == 1 and "1 -> 0" in events[0]["message"], events
            # the latency-first model has been idle just as long, and more
            loop.wait(lambda: len(loop.runner.endpoints(LATENCY)) == 1, 30, "latency-first serving")
        assert latency.samples and min(s.replicas for s in latency.samples) == 1
        assert loop.replicas(LATENCY) == 1
        reason = loop.model(LATENCY)["status"]["autoscaler"]["lastReason"]
        assert reason in ("Stable", "WithinTolerance"), reason
    finally:
        loop.delete(COST)
        loop.delete(LATENCY)
        loop.wait(lambda: loop.runner.processes(COST) + loop.runner.processes(LATENCY) == 0, 30, "servers stopped")
