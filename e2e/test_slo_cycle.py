"""SLO scaling on the whole loop: a missed TTFT target scales out, a steady load holds, its end scales in.

One replica of `maxNumSeqs: 2` under a closed loop of 5 clients runs 2 requests and queues 3, so TTFT is
bound by the queue: the waiting ones wait for a slot, up to a whole request (48 tokens of the tiny model,
about 0.1 s here), where a request that finds a slot has its first token in milliseconds; the p90 target is
0.05 s. The queue-depth rule alone would keep one replica (`targetQueueDepth: 16`: T = 18 requests per
replica, against 5), so the scale-out must be the SLO scaler's (reason SloScaleUp), from real TTFT
histograms read through Prometheus. Added pods share the same cores, so only their slots help: 3 replicas
hold the 5 clients in slots, and `maxReplicas: 3` is where it must settle. The load then stays for
FLOTILLA_SLO_E2E_S seconds in all (60 in `make test`, as the issue asks; 180 under `make sim`'s longer run):
over it, at a 2 s interval, the replicas never fall and change at most twice. When the load leaves, the model
returns to 1, in one monotone descent.

Then flotilla-sim replays the run (e2e/sim_replay.py) with the same decisions: the operator's decide_slo and
decide, combined as the operator combines them, on the simulated servers' TTFT histograms read as Prometheus
reads them; its replicas must agree with the real ones under flotilla_sim.agreement's rule.
"""

from __future__ import annotations

import os
import re
import time

from e2e.conftest import AUTOSCALE_INTERVAL_S, SERVER_START_S, SETTLE_S
from e2e.harness import Loop, Recorder, inference_model, monotone
from e2e.load import LoadGenerator
from e2e.sim_replay import check_scale_out, first_sample_s

NAME = "slo-cycle"
CLIENTS = 5  # 2 slots per replica: one replica queues 3, three hold all 5 in slots
MAX_TOKENS = 48
TTFT_TARGET_S = 0.05  # the tiny model answers 48 tokens in ~0.1 s: a queued request waits up to that long
SLO_WINDOW_S = 6  # slo.windowSeconds: six of the test Prometheus' 1 s scrapes
DOWN_WINDOW_S = 6  # scaleDownStabilizationSeconds
STEADY_S = float(os.environ.get("FLOTILLA_SLO_E2E_S", "60"))  # the whole time the load runs
SLO_UP_REASONS = ("SloScaleUp", "SloScaleUpRateLimited")


def test_a_missed_ttft_scales_out_holds_steady_and_scales_back(loop: Loop) -> None:
    model = inference_model(NAME, "cost-first", replicas=1, minReplicas=1, maxReplicas=3, targetQueueDepth=16,
                            scaleDownStabilizationSeconds=DOWN_WINDOW_S)
    model["spec"]["slo"] = {"ttftSeconds": TTFT_TARGET_S, "windowSeconds": SLO_WINDOW_S}
    loop.apply(model)
    try:
        loop.wait(lambda: loop.runner.endpoints(NAME), SERVER_START_S, "the first replica serving")
        # the load step starts on a replica Prometheus already scrapes: the measured scrape lag is then the lag of a
        # change, not the time Prometheus takes to pick up a new target
        loop.prometheus.wait_for(f'count(flotilla_slots{{model="{NAME}"}})', lambda v: v == 1, timeout_s=SETTLE_S)
        with Recorder(loop.k8s.url, NAME) as recorder:
            load_epoch_s, load_s = time.time(), time.monotonic()
            load = LoadGenerator(lambda: loop.runner.endpoints(NAME), NAME, CLIENTS, max_tokens=MAX_TOKENS).start()
            try:
                loop.wait(lambda: loop.replicas(NAME) >= 2, SETTLE_S, "the SLO scaler's scale-out")
                time.sleep(max(STEADY_S - (time.monotonic() - load_s), 0))
            finally:
                stopped_s, stopped_epoch_s = time.monotonic(), time.time()
                report = load.stop()
            loop.wait(lambda: loop.replicas(NAME) == 1, SETTLE_S, "back to 1 replica")
            loop.wait(lambda: loop.runner.processes(NAME) == 1, SETTLE_S, "surplus servers stopped")
        assert report.errors == [], report.errors[:5]
        assert stopped_s - load_s >= STEADY_S - 0.5  # the steady load lasted its whole time

        # The scale-out was the SLO's, on a TTFT measured past its target, soon after the load began.
        scales = loop.scales(NAME)
        ups = [e for reason in SLO_UP_REASONS for e in loop.events(NAME, reason)]
        assert ups, (scales, loop.model(NAME)["status"].get("autoscaler"))
        first_up = min(ups, key=lambda e: e["firstTimestamp"])
        measured = re.search(r"ttft p90=([0-9.e+-]+)s/", first_up["message"])
        assert measured and float(measured[1]) > 0.9 * TTFT_TARGET_S, first_up["message"]
        assert re.search(r"queue depth: \w+ 1\b", first_up["message"]), first_up["message"]  # alone, it kept 1
        print(f"\nthe first scale-out: {first_up['reason']}: {first_up['message']}")
        queue_epoch_s = first_sample_s(loop.prometheus,
                                       f'flotilla_requests_waiting{{namespace="default",model="{NAME}"}}', load_epoch_s)
        up_epoch_s = min(t for t, before, after in scales if after > before)
        # within a window and three ticks of the queue's first scrape: the window fills with queued requests' TTFTs
        limit_s = SLO_WINDOW_S + 3 * AUTOSCALE_INTERVAL_S
        assert queue_epoch_s is not None and up_epoch_s - queue_epoch_s <= limit_s, (queue_epoch_s, scales)
        assert not [s for s in scales if s[2] > s[1] and s[0] > stopped_epoch_s], scales  # none up after the load

        # No flapping over the steady load: never down, at most two steps up, settled where every client has a slot.
        during = recorder.between(load_s, stopped_s)
        assert monotone(during, rising=True), during
        assert len(set(during)) <= 3 and during[-1] == 3, during
        assert not [s for s in scales if s[2] < s[1] and s[0] < stopped_epoch_s], scales
        # back down when the load leaves, in one descent
        assert monotone(recorder.between(stopped_s, time.monotonic()), rising=False), recorder.samples[-10:]
        figures = loop.model(NAME)["status"]["slo"]
        assert figures["windowSeconds"] == SLO_WINDOW_S and "signal" in figures, figures

        # The simulator's replay of this run: the same decisions on simulated histograms.
        agreement = check_scale_out(loop, NAME, recorder.ticks(load_epoch_s), load_epoch_s, queue_epoch_s,
                                    stopped_epoch_s, CLIENTS, MAX_TOKENS, AUTOSCALE_INTERVAL_S, report)
        assert agreement.ok, agreement.table()
    finally:
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, SETTLE_S, "servers of the deleted model stopped")
