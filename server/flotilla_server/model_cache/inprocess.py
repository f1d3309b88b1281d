"""Each model's engine in this process, as a single-model server runs it: its own EngineCore, KV pool and
engine thread; only the weights are read in a helper process (weights_process.py). The `engines.Engines`
implementation the CLI picks today (docs/architecture.md, "Model cache")."""

from __future__ import annotations

import gc
import json
from dataclasses import replace
from pathlib import Path

from flotilla_server.engine.config import EngineConfig
from flotilla_server.model.config import ModelConfig
from flotilla_server.model_cache.engines import ModelEngine
from flotilla_server.model_cache.footprint import DTYPE_BYTES, kv_block_bytes, model_bytes
from flotilla_server.model_cache.weights_process import WeightsProcess


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
        self.weights = WeightsProcess()

    def start(self) -> None:
        """Start the weights helper now, so the first load does not wait for its start-up."""
        self.weights.start()

    def close(self) -> None:
        self.weights.close()

    def footprint_bytes(self, source: str) -> int:
        c = self.config
        return model_bytes(source_config(source), c.dtype, c.block_size, c.num_kv_blocks,
                           c.kv_cache_memory_bytes or 0)

    def load(self, name: str, source: str) -> ModelEngine:
        from flotilla_server.engine.client import EngineClient
        from flotilla_server.engine.core import EngineCore
        from flotilla_server.model.loader import load_model_with_weights

        config = replace(self.config, model=source)
        weights = self.weights.load(source, config.dtype)  # in the niced helper process
        loaded = load_model_with_weights(source, weights, config.dtype, config.device)
        del weights
        core = EngineCore(config, loaded)
        engine = EngineClient(core)
        engine.start()
        max_model_len = core.max_model_len
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
