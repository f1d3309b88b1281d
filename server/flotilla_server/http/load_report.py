"""The load report a gateway polls several times a second (flotilla_contract.load.ServerLoad at LOAD_PATH).

A pure function of the engine's counters and the admission queue's length: no I/O and no wait beyond the
engine's short state lock (never held across a forward pass), so polling it costs microseconds
(docs/architecture.md, "Load report"). Its figures are the same as the /metrics gauges.
"""

from __future__ import annotations

from flotilla_contract.load import ModelLoad, ServerLoad

from flotilla_server.engine.outputs import EngineStats


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
    )
