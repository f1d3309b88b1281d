"""Cost-first, min 1 to max 4: load at ~3x one replica's target scales out fast; quiet scales in late.

One replica of `maxNumSeqs: 2` with `targetQueueDepth: 2` carries T = 4 requests in flight, so a
closed loop of 12 clients is three replicas' worth. The operator must reach >= 3 replicas within
three autoscale intervals of the queue appearing in Prometheus, hold without flapping while the
load lasts, and return to 1 only after the (shortened) scale-down stabilization window, in one
monotone descent. Every request must complete or get 429 with Retry-After.

Then flotilla-sim replays the run (e2e/sim_replay.py): the same closed loop and InferenceModel, this
run's start-up delay, scrape lag and engine step over time, ticking when the operator ticked; its replicas
must be within 1 of the real ones at every tick, its scale-up and scale-down within two intervals.

Timing checks use the times events were recorded: Prometheus' timestamp of the first scrape that saw the
queue, the operator's scale Events and lastScaleTime, and clocks read as the load stopped; the waits'
deadlines only catch a hang.
"""

from __future__ import annotations

import time

from e2e.conftest import AUTOSCALE_INTERVAL_S, SERVER_START_S, SETTLE_S
from e2e.harness import Loop, Recorder, epoch, inference_model, monotone
from e2e.load import LoadGenerator
from e2e.sim_replay import check_scale_out, first_sample_s

NAME = "cycle"
WINDOW_S = 12  # scaleDownStabilizationSeconds
CLIENTS = 12  # 3 x (S + targetQueueDepth) = 3 x 4
LOAD_S = 20
MAX_TOKENS = 48


def test_scale_out_under_load_and_back_after_the_window(loop: Loop) -> None:
    loop.apply(inference_model(NAME, "cost-first", replicas=1, minReplicas=1, maxReplicas=4, targetQueueDepth=2,
                               scaleDownStabilizationSeconds=WINDOW_S))
    try:
        loop.wait(lambda: loop.runner.endpoints(NAME), SERVER_START_S, "the first replica serving")
        with Recorder(loop.k8s.url, NAME) as recorder:
            load_epoch_s = time.time()
            load = LoadGenerator(lambda: loop.runner.endpoints(NAME), NAME, CLIENTS, max_tokens=MAX_TOKENS).start()
            try:
                waiting = f'flotilla_requests_waiting{{namespace="default",model="{NAME}"}}'
                loop.prometheus.wait_for(f"sum({waiting})", lambda v: v > 0, timeout_s=SETTLE_S)
                queue_seen_s = time.monotonic()  # only times how long the load runs
                loop.wait(lambda: loop.replicas(NAME) >= 3, SETTLE_S, ">= 3 replicas")
                loop.wait(lambda: len(loop.runner.endpoints(NAME)) >= 3, SERVER_START_S, "three replicas serving")
                time.sleep(max(LOAD_S - (time.monotonic() - queue_seen_s), 0))
            finally:
                stopped_s = time.monotonic()  # before stop(), which waits for requests in flight
                stopped_epoch_s = time.time()
                report = load.stop()
                drained_epoch_s = time.time()  # the last request in flight has ended
            loop.wait(lambda: loop.replicas(NAME) == 1, SETTLE_S, "back to 1 replica")
            loop.wait(lambda: loop.runner.processes(NAME) == 1, SETTLE_S, "surplus servers stopped")
        down = recorder.first(lambda s: s.replicas == 1, after_s=stopped_s)
        assert down is not None, recorder.samples[-5:]
        down_s = down.t_s
        # the queue's first scrape (Prometheus' timestamp) and the scale-up the operator recorded as it made it
        queue_epoch_s = first_sample_s(loop.prometheus, waiting, load_epoch_s)
        scales = loop.scales(NAME)
        scaled_epoch_s = min((t for t, _, to in scales if to >= 3), default=None)
        assert queue_epoch_s is not None and scaled_epoch_s is not None, (queue_epoch_s, scales)

        def scaled_down_at() -> float | None:
            """lastScaleTime once it records the scale-down (later than every busy recommendation in status)."""
            auto = loop.model(NAME)["status"]["autoscaler"]
            busy = [epoch(r["time"]) for r in auto.get("recommendations") or [] if r["replicas"] > 1]
            at = epoch(auto["lastScaleTime"]) if auto.get("lastScaleTime") else None
            return at if at is not None and at > max(busy, default=0.0) else None

        down_epoch_s = loop.wait(scaled_down_at, SETTLE_S, "the scale-down recorded in status")  # the operator's record

        print(f"queue -> >=3 replicas {scaled_epoch_s - queue_epoch_s:.1f}s; load stop -> 1 replica "
              f"{down_epoch_s - stopped_epoch_s:.1f}s; "
              f"max {max(s.replicas for s in recorder.samples)} replicas; {report.completed} completed, "
              f"{report.rejected_429} x 429, {len(report.errors)} errors")
        assert scaled_epoch_s - queue_epoch_s <= 3 * AUTOSCALE_INTERVAL_S + 1, scaled_epoch_s - queue_epoch_s
        assert monotone(recorder.between(0, stopped_s), rising=True), recorder.between(0, stopped_s)
        assert monotone(recorder.between(stopped_s, down_s + 1), rising=False), recorder.between(stopped_s, down_s)
        # Only after the window: the last recommendation above 1 is a full window old at the scale-down,
        last_busy = max(t for t, n in recorder.recommendations() if n > 1)
        assert down_epoch_s - last_busy >= WINDOW_S - 0.5, (down_epoch_s - last_busy, recorder.recommendations())
        # and that recommendation came no earlier than an interval (plus a scrape) before the load stopped.
        assert down_epoch_s - stopped_epoch_s >= WINDOW_S - AUTOSCALE_INTERVAL_S - 1.5, down_epoch_s - stopped_epoch_s
        # and not much later: within the window and a few intervals of the last request's end
        assert down_epoch_s - drained_epoch_s <= WINDOW_S + 6 * AUTOSCALE_INTERVAL_S, down_epoch_s - drained_epoch_s
        assert report.errors == [], report.errors[:5]
        assert report.completed > 0
        auto = loop.model(NAME)["status"]["autoscaler"]
        assert auto["lastScaleTime"] and auto["recommendations"]

        # The simulator's replay of this run, from what the run measured.
        agreement = check_scale_out(loop, NAME, recorder.ticks(load_epoch_s), load_epoch_s, queue_epoch_s,
                                    stopped_epoch_s, CLIENTS, MAX_TOKENS, AUTOSCALE_INTERVAL_S, report)
        assert agreement.ok, agreement.table()
    finally:
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, SETTLE_S, "servers of the deleted model stopped")
