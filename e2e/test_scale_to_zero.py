"""Scale to zero is cost-first only: an idle cost-first model with min 0 goes to zero and reports
ScaledToZero, while an idle latency-first model beside it never drops below one replica.

Then flotilla-sim replays both models (e2e/sim_replay.py): the same InferenceModels, no load, this run's
start-up delay and scrape lag, ticking when the operator ticked; each model's replicas must be within 1
of the real ones at every tick, the scale to zero within two intervals of the real one.

The waits' deadlines only catch a hang: when things happened comes from the autoscaler's recorded ticks
and the pod runner's ready times.
"""

from __future__ import annotations

import time

from e2e.conftest import AUTOSCALE_INTERVAL_S, SERVER_START_S, SETTLE_S
from e2e.harness import Loop, Recorder, inference_model
from e2e.sim_replay import check, first_sample_s, scenario

COST, LATENCY = "zero-cost", "zero-latency"
IDLE_S = 6  # scaleToZeroAfterSeconds
WINDOW_S = 4  # scaleDownStabilizationSeconds


def test_cost_first_scales_to_zero_latency_first_keeps_one(loop: Loop) -> None:
    # recording from before the models exist, so the first autoscaler tick is seen
    with Recorder(loop.k8s.url, COST) as cost, Recorder(loop.k8s.url, LATENCY) as latency:
        applied_epoch_s = time.time()
        loop.apply(inference_model(COST, "cost-first", replicas=1, minReplicas=0, maxReplicas=2,
                                   scaleToZeroAfterSeconds=IDLE_S, scaleDownStabilizationSeconds=WINDOW_S))
        loop.apply(inference_model(LATENCY, "latency-first", replicas=1, minReplicas=1, maxReplicas=2,
                                   scaleToZeroAfterSeconds=IDLE_S, scaleDownStabilizationSeconds=WINDOW_S))
        try:
            # its server starts (and is scraped) first; when it went to zero is the replay's check, from the ticks
            loop.wait(lambda: loop.replicas(COST) == 0, SERVER_START_S + IDLE_S + WINDOW_S + SETTLE_S,
                      "cost-first at zero")
            loop.wait(lambda: loop.model(COST)["status"].get("phase") == "ScaledToZero", SETTLE_S, "phase ScaledToZero")
            loop.wait(lambda: loop.runner.processes(COST) == 0, SETTLE_S, "its server stopped")
            events = loop.events(COST, "ScaleToZero")
            assert len(events) == 1 and "1 -> 0" in events[0]["message"], events
            # the latency-first model has been idle just as long, and more
            loop.wait(lambda: len(loop.runner.endpoints(LATENCY)) == 1, SERVER_START_S, "latency-first serving")
            assert latency.samples and min(s.replicas for s in latency.samples) == 1
            assert loop.replicas(LATENCY) == 1
            reason = loop.model(LATENCY)["status"]["autoscaler"]["lastReason"]
            assert reason in ("Stable", "WithinTolerance"), reason

            # The simulator's replay of both models, from what this run measured: creation to serving
            # (the cost-first server may be stopped before it serves), and serving to the first scrape.
            served = [ready[0] for ready in (loop.runner.ready_epochs.get(m) for m in (COST, LATENCY)) if ready]
            start_up_s = sum(t - applied_epoch_s for t in served) / len(served)
            slots = first_sample_s(loop.prometheus, f'flotilla_slots{{namespace="default",model="{LATENCY}"}}',
                                   applied_epoch_s)
            assert slots is not None
            scrape_lag_s = max(slots - loop.runner.ready_epochs[LATENCY][0], 0.0)
            for name, recorder in ((COST, cost), (LATENCY, latency)):
                sim = scenario(loop.model(name), start_up_s=start_up_s, scrape_lag_s=scrape_lag_s, steps_s=(),
                               initial_ready_s=start_up_s)  # no load: no engine step
                agreement = check(name, recorder.ticks(applied_epoch_s), applied_epoch_s, sim, AUTOSCALE_INTERVAL_S)
                assert agreement.ok, agreement.table()
        finally:
            loop.delete(COST)
            loop.delete(LATENCY)
            loop.wait(lambda: loop.runner.processes(COST) + loop.runner.processes(LATENCY) == 0, SETTLE_S,
                      "servers stopped")
