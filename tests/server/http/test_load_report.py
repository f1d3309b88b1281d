"""The load report as a pure function of the engine's counters and the queue: a table of cases."""

from __future__ import annotations

import pytest
from flotilla_contract.load import ServerLoad
from flotilla_server.engine.outputs import EngineStats
from flotilla_server.http.load_report import pool_load, server_load
from flotilla_server.model_cache.membership import ListStatus, Skipped
from flotilla_server.model_cache.status import ModelStatus


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


def status(name, state, held=0, footprint=10, users=0, idle_s=None) -> ModelStatus:
    return ModelStatus(name, state, held, footprint, users, idle_s)


def test_a_pool_reports_each_model_and_sums_the_loaded_ones():
    rows = [
        (status("a", "loaded", held=40, idle_s=3.0), stats(waiting=1, running=2, slots=4, used=10, total=100), 2),
        (status("b", "loading", held=30, footprint=30, users=5), None, 0),  # held requests wait for the load
        (status("c", "available", footprint=50, idle_s=600.0), None, 0),
        (status("d", "loaded", held=20), stats(running=4, slots=4, used=90, total=100), 0),
    ]
    load = pool_load(accepting=True, models=rows, queue_capacity=32, budget_bytes=100, used_bytes=90)
    assert (load.waiting, load.running, load.slots, load.kv_usage) == (3 + 5, 2 + 4, 8, 0.5)
    assert [(m.name, m.state, m.waiting, m.running, m.memory_bytes, m.last_used_s) for m in load.models] == [
        ("a", "loaded", 3, 2, 40, 3.0), ("b", "loading", 5, 0, 30, None), ("c", "available", 0, 0, 50, 600.0),
        ("d", "loaded", 0, 4, 20, None)]
    assert (load.memory_budget_bytes, load.memory_free_bytes) == (100, 10)
    assert ServerLoad.model_validate_json(load.model_dump_json()) == load


def test_a_pool_with_nothing_loaded_is_ready_with_an_empty_kv():
    load = pool_load(accepting=True, models=[(status("a", "available"), None, 0)], queue_capacity=32,
                     budget_bytes=100, used_bytes=0)
    assert (load.ready, load.slots, load.kv_usage, load.memory_free_bytes) == (True, 0, 0.0, 100)


def test_a_pool_reports_its_list_files_refusals():
    listing = ListStatus("/etc/flotilla/pool/models", 2, "line 3: 'x' follows source '/m/b'",
                         (Skipped("ghost", "/m/ghost.gguf", "GGUF file /m/ghost.gguf not found"),))
    load = pool_load(accepting=True, models=[(status("a", "available"), None, 0)], queue_capacity=32,
                     budget_bytes=100, used_bytes=0, model_list=listing)
    assert (load.model_list.reload_failures, load.model_list.last_error) == (2, listing.last_error)
    assert [(s.name, s.source, s.error) for s in load.model_list.skipped] == [
        ("ghost", "/m/ghost.gguf", "GGUF file /m/ghost.gguf not found")]
    assert ServerLoad.model_validate_json(load.model_dump_json()) == load
    assert pool_load(accepting=True, models=[], queue_capacity=32, budget_bytes=100, used_bytes=0).model_list is None
