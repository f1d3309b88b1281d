"""The SLO policies in the simulator: Prometheus' histogram_quantile as emulated, the windows that feed it,
llm-d's rule worked by hand, and the operator's SLO scaler driving replicas in both fidelities."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flotilla_operator.autoscaler import COST_FIRST, ScalingSpec
from flotilla_operator.slo_scaler import SloTargets
from flotilla_sim import experiment, fluid, policies
from flotilla_sim.latency import (
    ITL_BOUNDS,
    TTFT_BOUNDS,
    EventWindow,
    LatencyView,
    TickWindow,
    histogram_quantile,
)
from flotilla_sim.policies import Metrics
from flotilla_sim.replay import E2EScenario, replay
from flotilla_sim.server_model import roofline
from flotilla_sim.slo_policies import LlmdController
from flotilla_sim.workload import Binned


def counts(*pairs: tuple[int, float]) -> np.ndarray:
    """Per-bucket TTFT counts from (bucket index, count) pairs."""
    row = np.zeros(len(TTFT_BOUNDS) + 1)
    for bucket, count in pairs:
        row[bucket] = count
    return row


@pytest.mark.parametrize(("row", "q", "want"), [
    (counts((10, 20)), 0.9, 2.35),  # all in (1, 2.5]: 1 + 1.5 x 0.9, as the real Prometheus says (test_slo_loop)
    (counts((0, 10)), 0.5, 0.0005),  # the first bucket interpolates from 0
    (counts((7, 5), (8, 5)), 0.5, 0.25),  # the rank ends a bucket: its upper bound
    (counts((7, 5), (len(TTFT_BOUNDS), 5)), 0.9, TTFT_BOUNDS[-1]),  # in +Inf: the top finite bound
    (counts(), 0.9, math.nan),  # no observation
])
def test_histogram_quantile_reads_buckets_as_prometheus_does(row: np.ndarray, q: float, want: float) -> None:
    got = histogram_quantile(q, row, TTFT_BOUNDS)[0]
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


def test_the_tick_window_forgets_what_left_it_exactly() -> None:
    window = TickWindow(2, tick_s=15.0, window_s=30.0)  # two ticks
    ttft = np.array([[0.2, 3.0]])  # one quantile point, two models
    for weight in (1e6, 0.3, 0.3):  # a huge first tick, then two small ones
        window.add_tick(ttft, np.array([[weight, 1.0]]), np.array([0.01, 0.01]), np.array([5.0, 5.0]))
    view = window.view()
    assert view.requests == pytest.approx([0.6, 2.0])  # the huge tick is gone without a trace
    assert view.ttft_s(0.9)[0] == pytest.approx(0.1 + 0.15 * 0.9)  # (0.1, 0.25]
    assert view.tpot_s(0.5) == pytest.approx([0.0075, 0.0075])  # (0.005, 0.01] by ITL_BOUNDS
    assert len(ITL_BOUNDS) + 1 == view.itl_counts.shape[1]


def test_the_event_window_holds_the_window_before_its_end() -> None:
    window = EventWindow(1, window_s=10.0)
    for t in (1.0, 5.0, 12.0):
        window.ttft(t, 0, 0.2)
    window.itl(12.0, 0, 0.03, tokens=4)
    assert window.view(11.0).requests == pytest.approx([1.0])  # (1, 11]: only 5.0
    assert window.view(12.0).requests == pytest.approx([2.0]) and window.view(12.0).itl_counts.sum() == 4


def view_with(ttft_s: float, tpot_s: float) -> LatencyView:
    """One model's window: 10 requests at `ttft_s`, 100 tokens at `tpot_s`."""
    ttft, itl = np.zeros((1, len(TTFT_BOUNDS) + 1)), np.zeros((1, len(ITL_BOUNDS) + 1))
    ttft[0, np.searchsorted(TTFT_BOUNDS, ttft_s)] = 10
    itl[0, np.searchsorted(ITL_BOUNDS, tpot_s)] = 100
    return LatencyView(ttft, itl)


def metrics(replicas: int, ready: int, view: LatencyView) -> Metrics:
    one = np.zeros(1)
    return Metrics(one, one, one, np.array([replicas]), np.array([ready]), np.full(1, np.nan), latency=view)


SLO = SloTargets(ttft_s=1.0, tpot_s=0.1)


def test_llmd_scales_up_credited_by_the_ready_replicas() -> None:
    # TTFT p90 in (2.5, 5] reads 4.75: s = min(4.75, 2) = 2 (clamped). n = 4, r = 2: c = 0.5,
    # d = 4 + ceil(4 (2 x 0.5 / 0.55 - 1)) = 8; the HPA allows max(100 %, 4): 8.
    controller = LlmdController(SLO, 1)
    assert controller.decide(0.0, metrics(4, 2, view_with(4.0, 0.01))).tolist() == [8]
    # the next minute: no second step up within the HPA's 60 s period, whatever the signal
    assert controller.decide(30.0, metrics(8, 2, view_with(4.0, 0.01))).tolist() == [8]


def test_llmd_holds_in_its_band_and_walks_down_one_pod_per_two_minutes() -> None:
    controller = LlmdController(SLO, 1)
    # TTFT p90 in (0.25, 0.5]: 0.475 / 1 = 0.475, between 0.40 and 0.55: hold
    assert controller.decide(0.0, metrics(10, 10, view_with(0.3, 0.001))).tolist() == [10]
    controller = LlmdController(SLO, 1)
    quiet = view_with(0.01, 0.001)  # s ~ 0.01: d = 10 - floor(10 x 0.97) = 1, the HPA takes one pod at a time
    out = [controller.decide(t, metrics(n, n, quiet)).tolist()[0] for t, n in ((0, 10), (60, 9), (120, 9), (240, 8))]
    assert out == [9, 9, 8, 7]  # 120 s between steps; the 180 s window holds only lower recommendations


def test_the_slo_policy_scales_a_load_step_and_back_in_the_fluid_mode() -> None:
    # One model: 10 minutes quiet, 10 minutes at 40 requests/s of 2,000-token prompts (four replicas' worth
    # of slots, queued on one), then quiet again. The SLO scaler must add replicas for it, and shed them after.
    ticks = 180
    rate = np.where((np.arange(ticks) >= 60) & (np.arange(ticks) < 120), 40.0, 0.2)
    work = Binned(5.0, (rate * 5.0)[:, None], np.full(ticks, 2000.0), np.full(ticks, 400.0))
    scenario = experiment.Scenario("step", work, roofline(), 15.0, {}, SloTargets(ttft_s=0.5, window_s=30.0))
    result = experiment.run_policies(scenario, (policies.SLO, policies.LLMD))
    for name in (policies.SLO, policies.LLMD):
        replicas = result[name]["replicas"]["total"]
        assert max(replicas) >= 3 and replicas[-1] < max(replicas), (name, replicas)


def test_the_replay_scales_on_ttft_beside_the_queue_depth_rule() -> None:
    # The e2e SLO cycle's model: the queue-depth rule alone keeps 1 (T = 2 + 16 = 18 for 5 clients), the SLO
    # scaler sees the queued requests' TTFT (3 waiting a 48-step request of 2 ms steps: ~0.1 s) past 0.05 s.
    spec = ScalingSpec(1, 3, COST_FIRST, target_queue_depth=16, scale_down_stabilization_s=6)
    sim = E2EScenario(spec, 2, 8, 20.0, start_up_s=3.0, scrape_lag_s=1.0, steps_s=((0.0, 0.002),), clients=5,
                      max_tokens=48, stop_s=20.0, slo=SloTargets(ttft_s=0.05, window_s=6.0))
    replayed = replay(sim, [2.0 * k for k in range(1, 20)])
    counts_seen = [n for _, n in replayed.timeline]
    assert counts_seen[0] == 3 and max(counts_seen) == 3  # one step to the slots for every client, the ceiling
    assert counts_seen[-1] == 1  # the load ended at 20 s: back to one once both windows have passed
    assert replayed.requests["served"] > 100


def test_fluid_conservation_holds_with_latency_kept() -> None:
    work = Binned(5.0, np.full((40, 2), 50.0), np.full(40, 500.0), np.full(40, 100.0))
    controller, initial = experiment.controller_for(policies.SLO, work, roofline(), 15.0)
    result = fluid.run(work, roofline(), controller, initial, "dedicated")
    q = result["requests"]
    assert q["served"] + q["rejected_429"] + q["rejected_503"] + q["still_queued"] == pytest.approx(q["arrived"])
