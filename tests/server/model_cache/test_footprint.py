"""A model's memory is known before loading it: the config's parameter count equals the loaded model's (a
GGUF's, read from its metadata, too), a loaded model's engine process holds the KV pool the footprint
predicted and ends with its unload, and a source the loader would refuse is refused before any load."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model import load_model
from flotilla_server.model_cache.engine_processes import EngineProcesses
from flotilla_server.model_cache.footprint import dense_weight_bytes, kv_block_bytes, parameter_count

from tests.server.model.gguf_files import T, write_llama_gguf
from tests.support.hf_models import make_hf_model_dir


@pytest.mark.parametrize(("arch", "overrides"), [
    ("llama", {}), ("llama", {"tie_word_embeddings": True}), ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("qwen2", {}), ("qwen3", {}), ("gemma3_text", {}), ("phi3", {"partial_rotary_factor": 0.5}),
    ("qwen3_moe", {}), ("mixtral", {"tie_word_embeddings": True}),  # all experts count, idle or not
])
def test_parameter_count_equals_the_loaded_models(arch, overrides, tmp_path):
    path = make_hf_model_dir(arch, tmp_path / arch, **overrides)
    loaded = load_model(str(path), "float32", "cpu")
    assert parameter_count(loaded.config) == sum(p.numel() for p in loaded.model.parameters())
    assert dense_weight_bytes(loaded.config, "float32", "cpu") == loaded.model.weight_bytes()


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
    with pytest.raises(ValueError, match=r"is neither 'tiny', a directory nor a \.gguf file: pass"):
        engines.footprint_bytes(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"config\.json not found"):
        engines.footprint_bytes(str(tmp_path / "empty"))


@pytest.mark.parametrize("quantization", [None, "none", "gguf"])
@pytest.mark.parametrize("tensor_type", [T.F32, T.F16, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_a_gguf_is_sized_from_its_metadata_as_the_loaded_model_holds_it(tmp_path, tensor_type, quantization):
    """Blocks kept (Q4_1, Q8_0 and the k-quants Q4_K, Q6_K under gguf, the default) cost their bytes; weights
    dequantized at load (F32, F16, which have no block kernel, and everything under none) cost their
    parameters in --dtype and, on CPU, a packed copy of every matmul weight."""
    path = write_llama_gguf(tmp_path / "m.gguf", tensor_type)
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=2**20, dtype="float32", quantization=quantization))
    loaded = load_model(str(path), "float32", "cpu", quantization)
    kv = 2**20 // kv_block_bytes(loaded.config, 16, "float32") * kv_block_bytes(loaded.config, 16, "float32")
    assert engines.footprint_bytes(str(path)) == loaded.model.weight_bytes() + kv
    kept = quantization != "none" and tensor_type in (T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K)
    assert loaded.model.quantization() == (f"gguf:{tensor_type.name}" if kept else "none")


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "absent.gguf", "GGUF file .*absent.gguf not found"),
    (lambda d: write_llama_gguf(d / "m.gguf", T.IQ4_XS), "type IQ4_XS, which Flotilla does not dequantize"),
    (lambda d: write_llama_gguf(d / "m.gguf", tokenizer_model="t5"), "tokenizer model 't5' is not supported"),
    (lambda d: _write(d / "m.gguf", b"GGUF\x03\x00"), "is not a GGUF file Flotilla can read"),
    (lambda d: _write(d / "m.gguf", b"not a gguf"), "is not a GGUF file .no GGUF magic."),
], ids=["missing", "tensor-type", "tokenizer", "cut-short", "not-gguf"])
def test_a_gguf_the_loader_would_refuse_is_refused_before_loading_with_its_message(tmp_path, make, message):
    with pytest.raises(ValueError, match=message):
        EngineProcesses(EngineConfig(kv_cache_memory_bytes=2**20)).footprint_bytes(str(make(tmp_path)))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
