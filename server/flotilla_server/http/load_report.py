"""The load report a gateway polls several times a second (flotilla_contract.load.ServerLoad at LOAD_PATH).

A pure function of the engine's counters and the admission queue's length: no I/O and no wait beyond the
engine's short state lock (never held across a forward pass), so polling it costs microseconds
(docs/architecture.md, "Load report"). Its figures are the same as the /metrics gauges.

Adapter rules (the gateway routes adapter requests by them: docs/gateway.md, "Adapter routing"):
- an adapter slot is pinned while a sequence of its adapter runs or waits (in the engine or its admission
  queue): free slots are `max_loras` less the resident adapters pinned so, never below 0;
- a pool's adapter slots are its loaded models' (each base has its own), summed for the server;
- a pool's refused adapter is a skipped list entry whose error names an adapter (model_cache/adapter_footprint.py
  starts each such error with `adapter 'NAME':`); a refused list version names no adapter (model_list.last_error).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from flotilla_contract.load import (
    AdapterRefused,
    AdapterServed,
    LastLoad,
    ModelListReport,
    ModelLoad,
    ServerLoad,
    SkippedModel,
)

from flotilla_server.engine.outputs import EngineStats
from flotilla_server.model_cache.membership import ListStatus
from flotilla_server.model_cache.status import ModelStatus

_ADAPTER_ERROR = re.compile(r"^adapter '([^']*)': ")


def adapter_slots_free(max_loras: int, stats: EngineStats) -> int:
    """Slots not pinned by a running or waiting sequence of their adapter."""
    pinned = set(stats.adapters_resident) & (set(stats.adapters_running) | set(stats.adapters_waiting))
    return max(0, max_loras - len(pinned))


def server_load(*, stats: EngineStats, queued: int, queue_capacity: int, accepting: bool,
                model_name: str, max_loras: int = 0) -> ServerLoad:
    """`queued`: requests in the admission queue; engine-side waiters (preempted) are added to them.
    `max_loras`: the engine's adapter slots (EngineInfo.max_loras; 0: it serves no adapters)."""
    waiting = queued + stats.num_waiting
    kv_usage = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
    return ServerLoad(
        ready=accepting,
        waiting=waiting,
        running=stats.num_running,
        slots=stats.num_slots,
        queue_capacity=queue_capacity,
        kv_usage=min(1.0, kv_usage),
        models=[ModelLoad(name=model_name, state="loaded", waiting=waiting, running=stats.num_running,
                          max_loras=max_loras, adapter_slots_free=adapter_slots_free(max_loras, stats))],
        prefix_keys=list(stats.prefix_keys),
        adapters=[AdapterServed(name=a, base=model_name) for a in stats.adapters_served],
        adapters_resident=list(stats.adapters_resident), max_loras=max_loras,
        adapter_slots_free=adapter_slots_free(max_loras, stats),
        adapters_refused=[AdapterRefused(name=n, error=e) for n, e in stats.adapters_refused],
    )


def pool_load(*, accepting: bool, models: list[tuple[ModelStatus, EngineStats | None, int]], queue_capacity: int,
              budget_bytes: int, used_bytes: int, model_list: ListStatus | None = None,
              adapters: Sequence[tuple[str, str]] = (), max_loras: dict[str, int] | None = None) -> ServerLoad:
    """A multi-model server's report: per model (its cache status, its engine's stats if loaded, and the
    requests in its admission queue); a model not loaded reports the requests held for its load as waiting.
    `model_list`: the list file's refusals, if the server follows one. `adapters`: the listed adapters as
    (name, base); `max_loras`: each loaded model's adapter slots (absent: none)."""
    rows, waiting, running, slots, kv_used, kv_total, keys = [], 0, 0, 0, 0, 0, []
    resident: list[str] = []
    lora_slots = lora_free = 0
    for status, stats, queued in models:
        own_slots = own_free = 0
        if stats is None:
            w, r = status.users, 0
        else:
            own_slots = (max_loras or {}).get(status.name, 0)
            own_free = adapter_slots_free(own_slots, stats)
            resident += stats.adapters_resident
            w, r = queued + stats.num_waiting, stats.num_running
            slots += stats.num_slots
            kv_used += stats.kv_blocks_used
            kv_total += stats.kv_blocks_total
            keys += stats.prefix_keys  # a key names its model: no two models share one
        waiting += w
        running += r
        lora_slots += own_slots
        lora_free += own_free
        last = status.last_load
        rows.append(ModelLoad(name=status.name, state=status.state, waiting=w, running=r,
                              last_used_s=status.idle_s, memory_bytes=status.memory_bytes or status.footprint_bytes,
                              max_loras=own_slots, adapter_slots_free=own_free, parked_bytes=status.parked_bytes,
                              last_load=None if last is None else LastLoad(
                                  origin=last.origin, seconds=last.seconds, start_s=last.start_s, read_s=last.read_s,
                                  build_s=last.build_s, warmup_s=last.warmup_s)))
    return ServerLoad(
        ready=accepting, waiting=waiting, running=running, slots=slots, queue_capacity=queue_capacity,
        kv_usage=min(1.0, kv_used / kv_total) if kv_total else 0.0, models=rows,
        memory_budget_bytes=budget_bytes, memory_free_bytes=max(0, budget_bytes - used_bytes), prefix_keys=keys,
        parked_bytes=sum(status.parked_bytes for status, _, _ in models),
        model_list=None if model_list is None else ModelListReport(
            path=model_list.path, reload_failures=model_list.reload_failures, last_error=model_list.last_error,
            skipped=[SkippedModel(name=s.name, source=s.source, error=s.error) for s in model_list.skipped]),
        adapters=[AdapterServed(name=a, base=b) for a, b in adapters], adapters_resident=resident,
        max_loras=lora_slots, adapter_slots_free=lora_free,
        adapters_refused=[] if model_list is None else [
            AdapterRefused(name=m.group(1), error=s.error) for s in model_list.skipped
            if (m := _ADAPTER_ERROR.match(s.error)) is not None],
    )
