"""A model's memory is known before loading it: the config's parameter count equals the loaded model's, and
the in-process engines measure what the footprint predicted."""

from __future__ import annotations

import gc
import weakref

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model import load_model
from flotilla_server.model_cache.footprint import parameter_count
from flotilla_server.model_cache.inprocess import InProcessEngines

from tests.support.hf_models import make_hf_model_dir


@pytest.mark.parametrize(("arch", "overrides"), [
    ("llama", {}), ("llama", {"tie_word_embeddings": True}), ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("qwen2", {}), ("qwen3", {}),
])
def test_parameter_count_equals_the_loaded_models(arch, overrides, tmp_path):
    path = make_hf_model_dir(arch, tmp_path / arch, **overrides)
    loaded = load_model(str(path), "float32", "cpu")
    assert parameter_count(loaded.config) == sum(p.numel() for p in loaded.model.parameters())


def test_loaded_memory_is_the_predicted_footprint_and_unloading_frees_the_model():
    engines = InProcessEngines(EngineConfig(kv_cache_memory_bytes=4 * 2**20, max_num_seqs=4))
    try:
        handle = engines.load("t", "tiny")
        assert handle.memory_bytes == engines.footprint_bytes("tiny")
        assert handle.engine.stats().kv_blocks_total > 0
        model = weakref.ref(handle.engine.core.loaded.model)
        kv = weakref.ref(handle.engine.core.runner.kv)
        engines.unload(handle)
        del handle
        gc.collect()
        assert model() is None and kv() is None  # no reference survives: the tensors are freed
    finally:
        engines.close()


def test_an_unreadable_source_says_what_to_give(tmp_path):
    engines = InProcessEngines(EngineConfig(kv_cache_memory_bytes=2**20))
    with pytest.raises(ValueError, match="give a Hugging Face model directory or 'tiny'"):
        engines.footprint_bytes(str(tmp_path / "missing"))
