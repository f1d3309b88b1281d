"""`adaptive` in the fluid loop (flotilla_sim/adaptive.py): the operator's decide_tier moves a model that turns
busy to dedicated replicas and back to the pool when it goes quiet, make-before-break (served from the tier
it is in until the other is ready), and every request is accounted for."""

from __future__ import annotations

import numpy as np
import pytest
from flotilla_operator import tiering
from flotilla_sim import adaptive, fluid
from flotilla_sim.adaptive import AdaptiveController, attainment
from flotilla_sim.latency import TTFT_BOUNDS
from flotilla_sim.server_model import roofline
from flotilla_sim.slo_policies import DEFAULT_SLO
from flotilla_sim.workload import Binned

TICK_S = 15.0
HOURS = 6


class Recorded(AdaptiveController):
    """The controller, with what each tick's `ready` saw and answered, and whether a move was in flight."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ticks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def ready(self, now_s: float, demand: np.ndarray) -> np.ndarray:
        moving_before = self.moving.copy()
        out = super().ready(now_s, demand)
        self.ticks.append((demand.copy(), out.copy(), moving_before | self.moving, self.dedicated.copy()))
        return out


@pytest.fixture(scope="module")
def run():
    """Model 0 busy all along; model 1 busy for 2 hours, then silent; model 2 a trickle all along."""
    profile = roofline()
    ticks = int(HOURS * 3600 / TICK_S)
    arrivals = np.zeros((ticks, 3))
    arrivals[:, 0] = 60.0
    arrivals[: ticks // 3, 1] = 60.0
    arrivals[::8, 2] = 1.0
    work = Binned(TICK_S, arrivals, np.full(ticks, 500.0), np.full(ticks, 400.0))
    controller = Recorded(3, profile, TICK_S, DEFAULT_SLO)
    result = fluid.run(work, profile, controller, np.zeros(3), "dedicated", fluid.FluidConfig(interval_s=60.0))
    return controller, result, work


def test_a_busy_model_is_promoted_and_a_silent_one_demoted_while_the_trickle_stays_pooled(run) -> None:
    controller, _, _ = run
    report = controller.report(HOURS * 3600)
    assert controller.dedicated.tolist() == [True, False, False]
    assert report["promotions"] == 2 and report["demotions"] == 1, report
    assert set(report["move_reasons"]) <= {tiering.REASON_SUSTAINED_DEMAND, tiering.REASON_SLO_MISSED_IN_POOL,
                                           tiering.REASON_COLD_LOADS, tiering.REASON_DEMAND_LOW}
    assert report["move_reasons"].get(tiering.REASON_DEMAND_LOW) == 1


def test_moves_make_before_they_break(run) -> None:
    """While a move is in flight the model is served (ready > 0 whenever it has demand) by the tier it leaves."""
    controller, _, _ = run
    in_flight = [(d, r) for d, r, moving, _ in controller.ticks for d, r in [(d[moving], r[moving])] if moving.any()]
    assert in_flight, "no move was in flight in any tick"
    for demand, ready in in_flight:
        assert (ready[demand > 0] > 0).all()


def test_every_request_is_served_and_none_waits_past_a_cold_load(run) -> None:
    _, result, work = run
    q = result["requests"]
    assert q["arrived"] == pytest.approx(work.arrivals.sum())
    assert q["rejected_429"] == q["rejected_503"] == 0
    assert q["served"] + q["still_queued"] == pytest.approx(q["arrived"])
    assert result["ttft_s"]["p99"] <= roofline().start_s + 2 * TICK_S


def test_the_fleets_move_budget_binds() -> None:
    """Ten models turning busy at once, a budget of 3 moves an hour: at most 3 start in any hour."""
    profile = roofline()
    ticks = int(3 * 3600 / TICK_S)
    work = Binned(TICK_S, np.full((ticks, 10), 200.0), np.full(ticks, 500.0), np.full(ticks, 400.0))
    spec = tiering.TieringSpec(max_moves_per_h=3)
    controller = AdaptiveController(10, profile, TICK_S, DEFAULT_SLO, spec)
    fluid.run(work, profile, controller, np.zeros(10), "dedicated", fluid.FluidConfig(interval_s=60.0))
    moves = np.array(sorted(controller.moves_s))
    assert len(moves) >= 3
    assert all(((moves > t - 3600) & (moves <= t)).sum() <= 3 for t in moves)


def test_attainment_reads_the_histogram_as_prometheus_would() -> None:
    """Whole buckets under the target, the bucket holding it in proportion; no first token: NaN."""
    counts = np.zeros((3, len(TTFT_BOUNDS) + 1))
    b = int(np.searchsorted(TTFT_BOUNDS, 1.0))  # the bucket whose upper bound is 1 s
    counts[0, b] = 10  # all within 1 s
    counts[1, b + 1] = 10  # all in the next bucket, above 1 s
    got = attainment(counts, float(TTFT_BOUNDS[b]))
    assert got[0] == pytest.approx(1.0) and got[1] == pytest.approx(0.0) and np.isnan(got[2])
    assert adaptive.HOUR_S == tiering.HOUR_S
