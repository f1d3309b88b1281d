"""The one interface between the model cache and the engines it starts and stops.

The cache knows only `Engines` (footprint_bytes, load, unload) and the `ModelEngine` handle it returns, so
moving each engine into its own process is a change to this file alone: a new `Engines` whose load starts
an engine process and returns a handle with that process's client (docs/architecture.md, "Model cache").
`InProcessEngines` runs each model's engine in this process, as a single-model server does. Loading
imports torch; the module itself does not, so the HTTP layer may name the handle's type.
"""

from __future__ import annotations

import gc
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from flotilla_server.engine.client import EngineClient
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model.config import ModelConfig
from flotilla_server.model_cache.footprint import DTYPE_BYTES, kv_block_bytes, model_bytes

log = logging.getLogger("flotilla.model_cache")


@dataclass(frozen=True, eq=False)
class ModelEngine:
    """A loaded model: its started engine and what the HTTP layer needs to serve it."""

    name: str
    source: str
    engine: EngineClient
    tokenizer: Any  # flotilla_server.model.tokenizer.Tokenizer
    vocab_size: int
    max_model_len: int
    memory_bytes: int  # weights and KV pool, as measured once loaded
    description: str = ""
    is_demonstration: bool = False


class Engines(Protocol):
    def footprint_bytes(self, source: str) -> int:
        """Memory the model will hold once loaded, before loading it; ValueError if the source is unusable."""

    def load(self, name: str, source: str) -> ModelEngine:
        """Load and start; runs on the cache's load worker, never on the event loop."""

    def unload(self, handle: ModelEngine) -> None:
        """Stop the engine and free its memory; the caller has dropped every other reference to it."""


def source_config(source: str) -> ModelConfig:
    """The model's config, read without loading weights ('tiny' or a Hugging Face directory)."""
    if source == "tiny":
        from flotilla_server.model.tiny import TINY_CONFIG

        return TINY_CONFIG
    path = Path(source) / "config.json"
    try:
        return ModelConfig.from_hf(json.loads(path.read_text()))
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}; give a Hugging Face model directory or 'tiny'") from None


class InProcessEngines:
    """Each model's engine in this process: its own EngineCore, KV pool and engine thread."""

    def __init__(self, config: EngineConfig) -> None:
        if config.kv_cache_memory_bytes is None and config.num_kv_blocks is None:
            raise ValueError("multi-model mode needs a fixed KV pool per model: set --kv-cache-memory")
        self.config = config

    def footprint_bytes(self, source: str) -> int:
        c = self.config
        return model_bytes(source_config(source), c.dtype, c.block_size, c.num_kv_blocks,
                           c.kv_cache_memory_bytes or 0)

    def load(self, name: str, source: str) -> ModelEngine:
        from flotilla_server.engine.factory import build_engine

        engine, loaded, max_model_len = build_engine(replace(self.config, model=source))
        weights = sum(p.numel() for p in loaded.model.parameters()) * DTYPE_BYTES[self.config.dtype]
        c = self.config
        kv = engine.stats().kv_blocks_total * kv_block_bytes(loaded.config, c.block_size, c.dtype)
        return ModelEngine(name=name, source=source, engine=engine, tokenizer=loaded.tokenizer,
                           vocab_size=loaded.config.vocab_size, max_model_len=max_model_len,
                           memory_bytes=weights + kv, description=loaded.description,
                           is_demonstration=loaded.is_demonstration)

    def unload(self, handle: ModelEngine) -> None:
        handle.engine.shutdown()
        del handle
        gc.collect()  # the model's modules hold reference cycles; free their tensors now, not at some later GC
        if self.config.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()  # hand the freed blocks back to the device, so the budget is real
