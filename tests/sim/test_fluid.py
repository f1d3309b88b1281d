import json

import numpy as np
import pytest
from flotilla_sim import experiment, policies
from flotilla_sim.server_model import roofline, service_s
from flotilla_sim.workload import Binned, bin_trace


def _scenario(trace, tick_s=5.0, interval_s=15.0):
    return experiment.Scenario("t", bin_trace(trace, tick_s), roofline(), interval_s, {})


@pytest.fixture(scope="module")
def results(request):
    from flotilla_sim.workload import diurnal, synthetic

    rng = np.random.default_rng(7)
    trace = synthetic(diurnal(6.0, 900.0, rng, trough=0.5), 3, rng, prompt_tokens=800, output_tokens=120)
    return experiment.run_policies(_scenario(trace))


@pytest.mark.parametrize("policy", policies.ALL)
def test_every_request_is_served_rejected_or_still_queued(results, policy):
    q = results[policy]["requests"]
    assert q["arrived"] > 1000
    assert q["served"] + q["rejected_429"] + q["rejected_503"] + q["still_queued"] == pytest.approx(q["arrived"])


def test_a_seeded_run_is_repeatable(small_trace):
    one = experiment.run_policies(_scenario(small_trace), (policies.COST_ZERO, policies.COST_POOL))
    two = experiment.run_policies(_scenario(small_trace), (policies.COST_ZERO, policies.COST_POOL))
    for result in (*one.values(), *two.values()):
        result.pop("wall_s")
    assert json.dumps(one, default=float) == json.dumps(two, default=float)


def test_scale_to_zero_policies_cold_start_and_dedicated_ones_do_not(results):
    assert results[policies.COST_ZERO]["cold_starts"] >= 3  # each of the three models wakes from zero
    assert results[policies.KUBEAI]["cold_starts"] >= 3
    assert results[policies.LATENCY]["cold_starts"] == 0
    assert results[policies.STATIC]["cold_starts"] == 0


def test_overload_beyond_the_queue_is_answered_429():
    profile = roofline()
    ticks = 60
    arrivals = np.full((ticks, 1), 2000.0)  # 400 req/s against one replica that finishes ~50/s
    work = Binned(5.0, arrivals, np.full(ticks, 1000.0), np.full(ticks, 200.0))
    controller = policies.StaticController(np.array([1]))
    from flotilla_sim import fluid

    result = fluid.run(work, profile, controller, np.array([1]), "dedicated")
    q = result["requests"]
    assert q["rejected_429"] > 0.5 * q["arrived"]
    assert q["served"] + q["rejected_429"] + q["still_queued"] == pytest.approx(q["arrived"])
    assert result["ttft_s"]["p99"] > 1.0  # the admitted wait behind a full queue


def test_static_replicas_carry_the_peak_at_headroom():
    peak = np.array([0.0, 47.9, 48.1, 480.0])
    assert list(policies.static_replicas(peak, 64)) == [1, 1, 2, 10]


def test_static_peak_of_a_trace_shorter_than_its_minute_counts_nothing_beyond_the_trace():
    profile = roofline()
    arrivals = np.array([[12.0], [0.0], [24.0]])  # 3 ticks of 5 s: 36 requests, under the 60 s window
    short = Binned(5.0, arrivals, np.full(3, 100.0), np.full(3, 10.0))
    padded = Binned(5.0, np.vstack([arrivals, np.zeros((40, 1))]), np.full(43, 100.0), np.full(43, 10.0))
    hold_s = service_s(profile, policies.STATIC_HEADROOM * profile.slots, 100.0, 10.0)
    assert experiment.peak_in_flight(short, profile) == pytest.approx([36 / 60 * hold_s])
    assert experiment.peak_in_flight(padded, profile) == pytest.approx([36 / 60 * hold_s])


def test_placement_puts_flotilla_cost_first_on_spot_nodes():
    assert policies.node_pool(policies.LATENCY) == "dedicated"
    assert policies.node_pool(policies.COST_ZERO) == "spot"
