"""`--quantization int8` at load: any source (a Hugging Face directory, a GGUF, `tiny`) gets int8 projections,
embedding and head, its footprint known before loading is what the loaded model holds, and a model whose
layer shapes the kernels cannot take (in_features not a multiple of 16) or a device other than the CPU is
refused before any weight is read, with one line naming `--quantization` (exit 2 from the CLI)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model import AttentionBatch, KVCacheTensors, load_model
from flotilla_server.model.quant_linear import Int8Embedding, Int8Linear
from flotilla_server.model.source import check_int8
from flotilla_server.model.tiny import TINY_CONFIG
from flotilla_server.model_cache.engine_processes import EngineProcesses
from flotilla_server.model_cache.footprint import int8_weight_bytes, kv_block_bytes

from tests.server.http.server_process import REPO
from tests.server.model.gguf_files import T, write_llama_gguf
from tests.support.hf_models import make_hf_model_dir
from tests.support.ports import free_port


def logits(model, ids: list[int]) -> torch.Tensor:
    cfg = model.config
    kv = KVCacheTensors.allocate(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, model.compute_dtype,
                                 torch.device("cpu"))
    batch = AttentionBatch.build([len(ids)], [len(ids)], [[0, 1, 2, 3]], 16, torch.device("cpu"))
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), batch, kv))


@pytest.mark.parametrize(("arch", "overrides"), [
    ("llama", {"attention_bias": True, "mlp_bias": True}), ("qwen3", {"tie_word_embeddings": True}),
])
def test_a_hf_directory_loads_as_int8_sized_as_its_footprint(arch, overrides, tmp_path):
    path = make_hf_model_dir(arch, tmp_path / arch, **overrides)
    dense = load_model(str(path), "float32", "cpu")
    loaded = load_model(str(path), "float32", "cpu", "int8")
    net = loaded.model
    assert net.quantization() == "int8"
    assert isinstance(net.embed_tokens, Int8Embedding) and all(
        isinstance(m, Int8Linear) for layer in net.layers
        for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj))
    assert (net.lm_head is None) == loaded.config.tie_word_embeddings
    assert net.norm.weight.dtype == torch.float32
    assert int8_weight_bytes(loaded.config, "float32", "cpu") == net.weight_bytes()
    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=2**20, quantization="int8"))
    kv = 2**20 // kv_block_bytes(loaded.config, 16, "float32") * kv_block_bytes(loaded.config, 16, "float32")
    assert engines.footprint_bytes(str(path)) == net.weight_bytes() + kv
    ids = list(range(3, 40))
    a, b = logits(net, ids), logits(dense.model, ids)
    assert (a - b).abs().max() <= 0.05 * b.abs().max()  # int8 weights: close, not equal


def test_tiny_and_a_gguf_load_as_int8_in_bfloat16_too(tmp_path):
    tiny = load_model("tiny", "bfloat16", "cpu", "int8")
    assert tiny.model.quantization() == "int8" and tiny.model.compute_dtype == torch.bfloat16
    assert int8_weight_bytes(TINY_CONFIG, "bfloat16", "cpu") == tiny.model.weight_bytes()
    assert logits(tiny.model, [1, 2, 3]).dtype == torch.float32
    path = write_llama_gguf(tmp_path / "m.gguf", T.Q8_0)
    gguf = load_model(str(path), "float32", "cpu", "int8")
    assert gguf.model.quantization() == "int8" and "int8 per channel" in gguf.description
    assert int8_weight_bytes(gguf.config, "float32", "cpu") == gguf.model.weight_bytes()


def test_a_layer_shape_the_kernels_cannot_take_is_refused_naming_it(tmp_path):
    path = make_hf_model_dir("llama", tmp_path / "odd", intermediate_size=72)
    message = r"quantization int8 cannot take layer model\.layers\.0\.mlp\.down_proj of shape \[64, 72\]"
    with pytest.raises(ValueError, match=message + r".*multiple of 16; pass --quantization none"):
        load_model(str(path), "float32", "cpu", "int8")
    with pytest.raises(ValueError, match=message):  # the model cache, before loading
        EngineProcesses(EngineConfig(kv_cache_memory_bytes=2**20)).footprint_bytes(str(path), "int8")
    assert load_model(str(path), "float32", "cpu").model.quantization() == "none"  # none serves it
    with pytest.raises(ValueError, match="quantization int8 runs on CPU here, not on cuda"):
        check_int8(TINY_CONFIG, "cuda")


def test_the_cli_exits_2_in_one_line_for_a_shape_the_kernels_cannot_take(tmp_path):
    path = make_hf_model_dir("llama", tmp_path / "odd", intermediate_size=72)
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", str(path), "--quantization", "int8",
           "--port", str(free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    expected = "error: --quantization int8 cannot take layer model.layers.0.mlp.down_proj of shape [64, 72]"
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
