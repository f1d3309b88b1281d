"""Each model's engine in its own process (issue 10), as a single-model server runs it: the `engines.Engines`
implementation the CLI picks (docs/architecture.md, "Model cache").

A load starts an engine process (engine/factory.make_engine) that reads the weights, builds its fixed KV
pool and serves through its EngineClient; an unload shuts that process down, so the operating system takes
back every byte of it: no reference cycles, no allocator caches to empty. The loading process shares no
GIL with the resident models' engines (each in its own process) nor with the HTTP loop.

Rules for a load, so that it does not starve the resident models:
- engine processes are forked from a forkserver that imported torch once (engine/backends.py): a load pays
  for its own model only, not for 3 s of CPU importing torch at full priority;
- the model loads on a thread niced by LOAD_NICE, on LOAD_THREADS torch thread(s); once loaded, the engine
  steps on its process's main thread, at normal priority, on its share of the CPU threads (threads.py), its
  steps of few rows included (they never borrow past the share: threads.small_step_threads).
The "inprocess" mode runs each engine on a thread of this process instead, at the server's priority and
thread count (tests, and machines where a process per model costs too much).

In the process mode an evicted model is parked where parking is on (parking.py): its engine process keeps its
weights outside the budget and waits, and its next load wakes it (build and warm-up only) before it would
fork a new engine that reads the source.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import replace
from typing import Any

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.cpu_quota import usable_cpus
from flotilla_server.engine.messages import EngineOptions
from flotilla_server.model.config import ModelConfig
from flotilla_server.model.dtype_choice import choose_dtype, read_cpu_facts
from flotilla_server.model.source import (
    check_fp8,
    check_int8,
    gguf_tensors,
    resolve_quantization,
    source_config,
)
from flotilla_server.model_cache.adapter_footprint import adapters_bytes
from flotilla_server.model_cache.engines import ModelEngine
from flotilla_server.model_cache.footprint import (
    dense_weight_bytes,
    fp8_weight_bytes,
    gguf_weight_bytes,
    int8_weight_bytes,
    kv_block_bytes,
    model_bytes,
)
from flotilla_server.model_cache.parked_policy import Stamp, source_stamp
from flotilla_server.model_cache.parking import ParkedModels, ParkedStatus, ParkingConfig
from flotilla_server.model_cache.threads import engine_threads, small_step_threads, threads_for_engines

# A load's CPU weight against a resident engine's: nice 10 is 110 against 1024 (Linux CFS), so a core that
# both want goes ~90% to the resident model, and an idle core still goes wholly to the load.
LOAD_NICE = 10
log = logging.getLogger("flotilla.model_cache")
LOAD_THREADS = 1


class EngineProcesses:
    """One engine per loaded model: its own process (mode "process") or its own thread ("inprocess")."""

    def __init__(self, config: EngineConfig, mode: str = "process", options: EngineOptions | None = None,
                 cpu_threads: int | None = None, parking: ParkingConfig | None = None) -> None:
        if config.kv_cache_memory_bytes is None and config.num_kv_blocks is None:
            raise ValueError("multi-model mode needs a fixed KV pool per model: set --kv-cache-memory")
        self.config = config
        self.mode = mode
        self.options = options or EngineOptions()
        # the threads left to engines: OMP_NUM_THREADS (the CLI's default leaves a core to the event loop),
        # within the usable CPUs (the cgroup's quota)
        self.cpu_threads = cpu_threads or threads_for_engines(os.environ.get("OMP_NUM_THREADS"), usable_cpus())
        self.cpu_facts = read_cpu_facts(os.environ)
        # parking needs an engine process to keep the weights: never in the inprocess mode
        self.parking = ParkedModels(parking if parking is not None and mode == "process" else ParkingConfig(0, 0))
        # a started engine's (its EngineClient's) backend, requested quantization and source stamp, to park it;
        # weak: an engine that died is forgotten with its client
        self._parkable: weakref.WeakKeyDictionary[Any, tuple[Any, str | None, Stamp]] = weakref.WeakKeyDictionary()
        self._configs: dict[tuple[str, Stamp], ModelConfig] = {}  # _source_config's

    def start(self) -> None:
        """Start the forkserver (process mode): it imports torch now, in the background, not in the first load."""
        if self.mode == "process":
            from flotilla_server.engine.backends import start_forkserver

            start_forkserver()
        self.parking.start()

    def close(self) -> None:
        """Stop the parked engines (each unload stopped or parked its own)."""
        self.parking.close()

    def parked(self) -> list[ParkedStatus]:
        return self.parking.status()

    def footprint_bytes(self, source: str, quantization: str | None = None,
                        adapters: tuple[tuple[str, str], ...] = ()) -> int:
        """Weights (from the config the loader would read: config.json, or a GGUF's metadata) plus the fixed
        KV pool, plus with `adapters` their slots and host copies (adapter_footprint.py); ValueError, saying
        what to pass, for a source the loader would refuse before its weights, or an unreadable adapter."""
        c = self.config
        model = self._source_config(source)
        held = resolve_quantization(source, quantization or c.quantization)
        # the dtype the engine will choose (`auto`: engine/core.py logs it); a GPU's float16 costs as bfloat16
        dtype = choose_dtype(c.dtype, c.device, held, self.cpu_facts, moe=model.moe is not None).dtype
        if held == "gguf":
            weights = gguf_weight_bytes(model, gguf_tensors(source), dtype, c.device)
        elif held == "int8":
            check_int8(model, c.device)  # as the loader will, before any weight is read
            weights = int8_weight_bytes(model, dtype, c.device)
        elif held == "fp8":
            check_fp8(model, c.device)
            weights = fp8_weight_bytes(model, dtype)
        else:
            weights = dense_weight_bytes(model, dtype, c.device)
        return (model_bytes(model, weights, dtype, c.block_size, c.num_kv_blocks, c.kv_cache_memory_bytes or 0)
                + adapters_bytes(model, adapters, c.max_loras, c.max_lora_rank, dtype))

    def load(self, name: str, source: str, models_at_once: int = 1, quantization: str | None = None,
             adapters: tuple[tuple[str, str], ...] = ()) -> ModelEngine:
        """Start the model's engine; with `adapters`, it serves them (read at its start, a bad one refuses the
        load) and takes more at run time (LoadAdapter), in --max-loras slots."""
        from flotilla_server.engine.client import EngineStartError
        from flotilla_server.engine.factory import make_engine, make_parkable_engine

        model_config = self._source_config(source)  # ValueError on an unusable source, before a process starts
        share = engine_threads(self.cpu_threads, models_at_once)
        config = replace(self.config, model=source, quantization=quantization or self.config.quantization,
                         small_step_threads=small_step_threads(share, self.config.small_step_threads),
                         loras=adapters, lora_runtime_loads=bool(adapters))
        origin, backend, stamp = "disk", None, ()
        if self.mode == "process":
            options = replace(self.options, load_nice=LOAD_NICE, load_threads=LOAD_THREADS, num_threads=share)
            stamp = source_stamp(source)  # before the read: a change during the model's residence counts
            woken = self.parking.take(name, source, quantization)
            if woken is not None:
                engine, backend = make_parkable_engine(config, replace(options, load_nice=0, load_threads=None),
                                                       woken=woken)
                try:
                    info, origin = replace(engine.start(), tokenizer=woken.tokenizer), "parked"
                except EngineStartError as e:  # the engine process is stopped: read the source instead
                    log.warning("model %s: waking its parked copy failed (%s); it loads from %s", name, e, source)
                    self.parking.ended(woken.process.pid)
            if origin == "disk":
                engine, backend = make_parkable_engine(config, options)
        else:
            engine = make_engine(config, "inprocess", self.options)
        if origin == "disk":
            try:
                info = engine.start()
            except EngineStartError as e:
                raise ValueError(str(e)) from None
        if backend is not None:
            self._parkable[engine] = (backend, quantization, stamp)
        kv = info.num_kv_blocks * kv_block_bytes(model_config, info.block_size, info.dtype)
        lora = adapters_bytes(model_config, adapters, config.max_loras, config.max_lora_rank, info.dtype)
        return ModelEngine(name=name, source=source, engine=engine, tokenizer=info.tokenizer,
                           vocab_size=info.vocab_size, max_model_len=info.max_model_len,
                           memory_bytes=info.weight_bytes + kv + lora, description=info.description,
                           is_demonstration=info.is_demonstration, weight_bytes=info.weight_bytes,
                           quantization=info.quantization, adapter_slots=info.max_loras, origin=origin,
                           phases=backend.phases if backend is not None else None)

    def _source_config(self, source: str) -> ModelConfig:
        """source.source_config, kept while the source's files are unchanged: a GGUF's metadata (its
        tokenizer's 49k strings) takes 0.2 s to parse, on every load."""
        key = (source, source_stamp(source))
        config = self._configs.get(key)
        if config is None:
            config = source_config(source)
            self._configs = {k: c for k, c in self._configs.items() if k[0] != source}  # its older versions
            self._configs[key] = config
        return config

    def unload(self, handle: ModelEngine, park: bool = True, loading: str | None = None) -> None:
        parkable = self._parkable.pop(handle.engine, None)
        if parkable is not None:
            backend, quantization, stamp = parkable
            pid = handle.engine.pid
            if park and self.parking.config.enabled and handle.engine.alive:
                self.parking.park(handle.name, handle.source, quantization, backend, stamp, handle.tokenizer, loading)
            else:
                self.parking.drop(handle.name)
            self.parking.ended(pid)  # a woken engine's old parked file (a new one was written, or it stopped)
        handle.engine.shutdown()  # process mode: the process exits and its memory goes with it (parked: it stays)
        if self.mode != "process":
            import gc

            gc.collect()  # the model's modules hold reference cycles; free their tensors now
            if self.config.device.startswith("cuda"):
                import torch

                torch.cuda.empty_cache()
