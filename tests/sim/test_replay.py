"""The e2e replay: e2e/load.py's closed loop, the scrape lag, the real ticks and the measured step times,
each checked on a case small enough to work out by hand."""

import pytest
from flotilla_operator.autoscaler import COST_FIRST, REASON_METRICS_UNAVAILABLE, ScalingSpec
from flotilla_sim.replay import ClosedLoopSim, E2EScenario, replay

# the scale-cycle model: cost-first, min 1, max 4, 2 slots + targetQueueDepth 2 = 4 requests per replica
CYCLE = ScalingSpec(1, 4, COST_FIRST, target_queue_depth=2, scale_down_stabilization_s=12)


def _scenario(**changes) -> E2EScenario:
    settings = dict(spec=CYCLE, slots=2, queue_per_slot=8, queue_timeout_s=20.0, start_up_s=30.0, scrape_lag_s=0.0,
                    steps_s=((0.0, 0.1),), clients=12, max_tokens=3, stop_s=100.0)
    return E2EScenario(**(settings | changes))


def test_each_client_sends_its_next_request_when_the_last_is_answered():
    # 2 clients, 2 slots, 0.1 s steps, 3 tokens (a prefill step gives the first, then 2 decode steps).
    # A's first request starts a step alone at 0; B's joins at the next step: answered at 0.3 and 0.4.
    # Each next request is sent as its worker is answered, while the step after that answer has begun,
    # so it joins one step later: 0.4 s a request from then on. Nothing is sent after stop_s = 1.0.
    sim = ClosedLoopSim(_scenario(clients=2, stop_s=1.0))
    sim.start()
    result = sim.run(until_s=2.0, tick_times_s=[])
    assert sim.trace.arrival_s == pytest.approx([0.0, 0.0, 0.3, 0.4, 0.7, 0.8])
    assert sim.finish_s == pytest.approx([0.3, 0.4, 0.7, 0.8, 1.1, 1.2])
    assert result["requests"]["served"] == 6


def test_the_autoscaler_sees_the_queue_one_scrape_lag_late():
    # 12 clients from 0: R + Q = 12, so ceil(12 / 4) = 3 replicas, at the first tick that sees them
    assert replay(_scenario(), [0.5, 1.5, 2.5]).timeline == [(0.5, 3), (1.5, 3), (2.5, 3)]
    late = replay(_scenario(scrape_lag_s=1.0), [0.5, 1.5, 2.5])
    assert late.timeline == [(0.5, 1), (1.5, 3), (2.5, 3)]
    assert late.seen[0] == (0.0, 0.0) and late.seen[1] == (2.0, 10.0)


def test_a_replica_not_yet_scraped_holds_the_decision_as_missing_metrics():
    # ready at 1.0, but the tick at 2.0 sees Prometheus as of 0.5, before it reported
    sim = ClosedLoopSim(_scenario(clients=0, scrape_lag_s=1.5, initial_ready_s=1.0))
    sim.run(until_s=2.0, tick_times_s=[2.0])
    assert sim.controller.reasons == [REASON_METRICS_UNAVAILABLE]


def test_a_decode_span_follows_the_measured_step_time_where_it_changes():
    # prefill [0, 0.1] at 0.1 s; decode at 0.1 s to 0.5 (4 tokens), then at 0.2 s: 5 tokens to 1.5
    sim = ClosedLoopSim(_scenario(clients=1, max_tokens=10, stop_s=0.0, steps_s=((0.0, 0.1), (0.5, 0.2))))
    sim.start()
    sim.run(until_s=3.0, tick_times_s=[])
    assert sim.first_token_s == pytest.approx([0.1])
    assert sim.finish_s == pytest.approx([1.5])
