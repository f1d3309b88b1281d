"""The load report as a pure function of the engine's counters and the queue: a table of cases."""

from __future__ import annotations

import pytest
from flotilla_contract.load import ServerLoad
from flotilla_server.engine.outputs import EngineStats
from flotilla_server.http.load_report import server_load


def stats(waiting=0, running=0, slots=4, used=0, total=100) -> EngineStats:
    return EngineStats(num_waiting=waiting, num_running=running, num_slots=slots, kv_blocks_used=used,
                       kv_blocks_total=total, num_preemptions=0)


@pytest.mark.parametrize(("engine", "queued", "accepting", "waiting", "running", "kv_usage"), [
    (stats(), 0, True, 0, 0, 0.0),
    (stats(running=4, used=25), 3, True, 3, 4, 0.25),
    (stats(waiting=2, running=4, used=100), 5, True, 7, 4, 1.0),  # preempted sequences wait too
    (stats(total=0), 0, False, 0, 0, 0.0),  # an empty pool reports 0, never divides by zero
])
def test_figures(engine, queued, accepting, waiting, running, kv_usage):
    load = server_load(stats=engine, queued=queued, queue_capacity=32, accepting=accepting, model_name="m")
    assert (load.ready, load.waiting, load.running, load.slots, load.queue_capacity, load.kv_usage) == (
        accepting, waiting, running, engine.num_slots, 32, kv_usage)
    [model] = load.models
    assert (model.name, model.state, model.waiting, model.running) == ("m", "loaded", waiting, running)
    assert ServerLoad.model_validate_json(load.model_dump_json()) == load  # what the gateway parses back
