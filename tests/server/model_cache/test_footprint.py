"""A model's memory is known before loading it: the config's parameter count equals the loaded model's, and
a loaded model's engine process holds the KV pool the footprint predicted and ends with its unload."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model import load_model
from flotilla_server.model_cache.engine_processes import EngineProcesses
from flotilla_server.model_cache.footprint import parameter_count

from tests.support.hf_models import make_hf_model_dir


@pytest.mark.parametrize(("arch", "overrides"), [
    ("llama", {}), ("llama", {"tie_word_embeddings": True}), ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("qwen2", {}), ("qwen3", {}),
])
def test_parameter_count_equals_the_loaded_models(arch, overrides, tmp_path):
    path = make_hf_model_dir(arch, tmp_path / arch, **overrides)
    loaded = load_model(str(path), "float32", "cpu")
    assert parameter_count(loaded.config) == sum(p.numel() for p in loaded.model.parameters())


def test_loaded_memory_is_the_predicted_footprint_and_unloading_ends_the_engine_process():
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=4 * 2**20, max_num_seqs=4))
    try:
        handle = engines.load("t", "tiny")
        assert handle.memory_bytes == engines.footprint_bytes("tiny")
        assert handle.engine.stats().kv_blocks_total > 0
        pid = handle.engine.pid
        assert pid != os.getpid() and Path(f"/proc/{pid}").exists()  # the model lives in its own process
        engines.unload(handle)
        assert not handle.engine.alive
        deadline = time.monotonic() + 10
        while _running(pid):  # the process is gone, and every byte of the model with it
            assert time.monotonic() < deadline, f"engine process {pid} still runs after the unload"
            time.sleep(0.1)
    finally:
        engines.close()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_an_unreadable_source_says_what_to_give(tmp_path):
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=2**20))
    with pytest.raises(ValueError, match="give a Hugging Face model directory or 'tiny'"):
        engines.footprint_bytes(str(tmp_path / "missing"))
