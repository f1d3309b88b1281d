"""The load report a gateway polls several times a second (flotilla_contract.load.ServerLoad at LOAD_PATH).

A pure function of the engine's counters and the admission queue's length: no I/O and no wait beyond the
engine's short state lock (never held across a forward pass), so polling it costs microseconds
(docs/architecture.md, "Load report"). Its figures are the same as the /metrics gauges.
"""

from __future__ import annotations

from flotilla_contract.load import ModelListReport, ModelLoad, ServerLoad, SkippedModel

from flotilla_server.engine.outputs import EngineStats
from flotilla_server.model_cache.membership import ListStatus
from flotilla_server.model_cache.status import ModelStatus


def server_load(*, stats: EngineStats, queued: int, queue_capacity: int, accepting: bool,
                model_name: str) -> ServerLoad:
    """`queued`: requests in the admission queue; engine-side waiters (preempted) are added to them."""
    waiting = queued + stats.num_waiting
    kv_usage = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
    return ServerLoad(
        ready=accepting,
        waiting=waiting,
        running=stats.num_running,
        slots=stats.num_slots,
        queue_capacity=queue_capacity,
        kv_usage=min(1.0, kv_usage),
        models=[ModelLoad(name=model_name, state="loaded", waiting=waiting, running=stats.num_running)],
        prefix_keys=list(stats.prefix_keys),
    )


def pool_load(*, accepting: bool, models: list[tuple[ModelStatus, EngineStats | None, int]], queue_capacity: int,
              budget_bytes: int, used_bytes: int, model_list: ListStatus | None = None) -> ServerLoad:
    """A multi-model server's report: per model (its cache status, its engine's stats if loaded, and the
    requests in its admission queue); a model not loaded reports the requests held for its load as waiting.
    `model_list`: the list file's refusals, if the server follows one."""
    rows, waiting, running, slots, kv_used, kv_total, keys = [], 0, 0, 0, 0, 0, []
    for status, stats, queued in models:
        if stats is None:
            w, r = status.users, 0
        else:
            w, r = queued + stats.num_waiting, stats.num_running
            slots += stats.num_slots
            kv_used += stats.kv_blocks_used
            kv_total += stats.kv_blocks_total
            keys += stats.prefix_keys  # a key names its model: no two models share one
        waiting += w
        running += r
        rows.append(ModelLoad(name=status.name, state=status.state, waiting=w, running=r,
                              last_used_s=status.idle_s, memory_bytes=status.memory_bytes or status.footprint_bytes))
    return ServerLoad(
        ready=accepting, waiting=waiting, running=running, slots=slots, queue_capacity=queue_capacity,
        kv_usage=min(1.0, kv_used / kv_total) if kv_total else 0.0, models=rows,
        memory_budget_bytes=budget_bytes, memory_free_bytes=max(0, budget_bytes - used_bytes), prefix_keys=keys,
        model_list=None if model_list is None else ModelListReport(
            path=model_list.path, reload_failures=model_list.reload_failures, last_error=model_list.last_error,
            skipped=[SkippedModel(name=s.name, source=s.source, error=s.error) for s in model_list.skipped]),
    )
