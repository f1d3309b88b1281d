import dataclasses

import numpy as np
import pytest
from flotilla_sim import experiment, fluid, policies, request_level
from flotilla_sim.request_level import RequestSim
from flotilla_sim.server_model import ServerProfile
from flotilla_sim.workload import bin_trace, make_trace

# every step takes 100 ms, whatever its batch or prompt: the timeline can be worked out by hand
FLAT = ServerProfile(source="test", weight_bytes=1.0, params=1.0, step_base_s=0.1, slots=2, queue_per_slot=1)


def _run(trace, replicas=1):
    sim = RequestSim(trace, FLAT, policies.StaticController(np.array([replicas])), np.array([replicas]), 15.0)
    return sim, sim.run(until_s=30.0)


def test_a_tiny_trace_follows_its_hand_worked_timeline():
    # r0 at 0.00 (3 tokens); r1 at 0.05 (2 tokens); r2 at 0.42 (1 token); r3 at 0.43 (4 tokens); one replica, 2 slots
    trace = make_trace([0.0, 0.05, 0.42, 0.43], [0, 0, 0, 0], [10, 10, 10, 10], [3, 2, 1, 4])
    sim, result = _run(trace)
    # step 1 [0.0, 0.1]: prefill r0 -> its first token. r1 waits for the step in progress.
    # step 2 [0.1, 0.2]: prefill r1, decode r0.   step 3 [0.2, 0.3]: decode both; both finish.
    # idle until r2 at 0.42: step [0.42, 0.52] prefills r2 (1 token: done). r3 queued at 0.43 waits.
    # step [0.52, 0.62] prefills r3; then a span of 3 decode steps ends at 0.92.
    assert sim.first_token_s == pytest.approx([0.1, 0.2, 0.52, 0.62])
    assert sim.finish_s == pytest.approx([0.3, 0.3, 0.52, 0.92])
    assert result["requests"]["served"] == 4
    assert result["gpu_hours"] == pytest.approx(30.0 / 3600)


def test_a_request_arriving_mid_span_joins_at_the_next_step():
    # r0 decodes 10 tokens from 0.1 (a span to 1.0); r1 at 0.35 joins after the step in progress, at 0.4
    trace = make_trace([0.0, 0.35], [0, 0], [10, 10], [10, 2])
    sim, _ = _run(trace)
    assert sim.first_token_s == pytest.approx([0.1, 0.5])
    assert sim.finish_s == pytest.approx([1.0, 0.6])


def test_full_queue_answers_429_and_every_request_is_accounted_for():
    # slots fill only at a step's start: r0 starts the first step alone, r1 and r2 fill the queue of
    # 2 (1 per slot), and r3 and r4, arriving at the same instant, are refused
    trace = make_trace([0.0] * 5, [0] * 5, [10] * 5, [50] * 5)
    sim, result = _run(trace)
    q = result["requests"]
    assert q["rejected_429"] == 2
    assert list(np.isnan(sim.finish_s)) == [False, False, False, True, True]
    assert q["served"] + q["rejected_429"] + q["rejected_503"] + q["still_queued"] == q["arrived"] == 5


def test_a_request_queued_past_its_timeout_is_answered_429_then():
    # two slots busy with 50-token requests; the third waits, and its 0.25 s queue timeout runs out at 0.25
    profile = dataclasses.replace(FLAT, queue_per_slot=2, queue_timeout_s=0.25)
    trace = make_trace([0.0, 0.0, 0.0], [0] * 3, [10] * 3, [50] * 3)
    counts = []
    for until_s in (0.2, 0.3):
        sim = RequestSim(trace, profile, policies.StaticController(np.array([1])), np.array([1]), 15.0)
        counts.append(sim.run(until_s=until_s)["requests"]["rejected_429"])
    assert counts == [0, 1]


@pytest.mark.parametrize("policy", [policies.LATENCY, policies.COST_ZERO])
def test_request_level_agrees_with_the_fluid_mode(small_trace, policy):
    from flotilla_sim.server_model import roofline

    profile = roofline()
    request = request_level.run_policy(small_trace, profile, policy, 15.0, until_s=915.0)
    work = bin_trace(small_trace, 5.0, 915.0)
    controller, initial = experiment.controller_for(policy, work, profile, 15.0)
    fluid_result = fluid.run(work, profile, controller, initial, "x")
    assert fluid_result["gpu_hours"] == pytest.approx(request["gpu_hours"], rel=0.10)
    assert fluid_result["ttft_s"]["p50"] == pytest.approx(request["ttft_s"]["p50"], rel=0.10)
    q = request["requests"]
    assert q["served"] + q["rejected_429"] + q["rejected_503"] + q["still_queued"] == q["arrived"]


def test_request_level_is_repeatable(small_trace):
    from flotilla_sim.server_model import roofline

    one = request_level.run_policy(small_trace, roofline(), policies.KUBEAI, 15.0, until_s=240.0)
    two = request_level.run_policy(small_trace, roofline(), policies.KUBEAI, 15.0, until_s=240.0)
    assert one["requests"]["served"] > 100
    assert one == two


def test_the_shared_pool_runs_in_the_fluid_mode_only(small_trace):
    with pytest.raises(ValueError, match="fluid mode only"):
        request_level.run_policy(small_trace, FLAT, policies.COST_POOL, 15.0)
