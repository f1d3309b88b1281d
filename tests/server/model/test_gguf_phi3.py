"""GGUF files of architecture phi3 (Phi-3, Phi-3.5, Phi-4): Q/K/V in one `attn_qkv`, gate and up in one `ffn_up`,
a partial rotary (`rope.dimension_count`), LongRoPE (`rope_factors_short`/`_long` tensors and `rope.scaling.*`
keys) and a sliding window, as llama.cpp's converter writes them.

References: transformers' own GGUF loader on the same file for the fused layout, float and quantized (held as
blocks and dequantized); it ignores `rope.dimension_count` and the rope factors, so a file with those is written
from a Hugging Face directory and compared with transformers on that directory.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flotilla_server.model import UnsupportedModelError, load_model
from flotilla_server.model.quant_linear import QuantizedLinear
from flotilla_server.model.rope import inverse_frequencies
from flotilla_server.model.source import gguf_tensors
from flotilla_server.model_cache.footprint import gguf_weight_bytes
from safetensors.numpy import load_file

from tests.support.hf_models import make_hf_model_dir

from .gguf_reference import load_reference
from .test_gguf_qwen import LAYERS, T, assert_greedy_equals, write_decoder_gguf
from .test_longrope import LONGROPE, ORIGINAL, PHI4_MINI_LIKE

PAD = {"tokenizer.ggml.padding_token_id": 0}  # Phi3Config's default pad id (32000) is past the test vocabulary
_NAMES = {"self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


@pytest.mark.parametrize("tensor_type", [T.F32, T.F16, T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_phi3_gguf_equals_transformers_gguf_loader(tmp_path: Path, tensor_type: T) -> None:
    path = write_decoder_gguf(tmp_path / f"phi3.{tensor_type.name}.gguf", "phi3", tensor_type, fused=True, **PAD)
    loaded = load_model(str(path), "float32", "cpu")
    config, net = loaded.config, loaded.model
    assert (config.model_type, config.rotary_dim, config.rope_scaling) == ("phi3", config.head_dim, None)
    quantized = tensor_type not in (T.F32, T.F16)
    assert net.quantization() == (f"gguf:{tensor_type.name}" if quantized else "none")
    fused = [m for layer in net.layers for m in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj)]
    assert all(isinstance(m, QuantizedLinear) == quantized for m in fused)
    assert gguf_weight_bytes(config, gguf_tensors(str(path)), "float32", "cpu") == net.weight_bytes()
    reference = load_reference(path, LAYERS, "phi3").model
    if quantized:  # the blocks' products, then the same file dequantized
        assert_greedy_equals(path, reference, "gguf")
    assert_greedy_equals(path, reference, "none")


def gguf_from_phi3_dir(directory: Path, path: Path, tensor_type: T = T.F32, **options) -> Path:
    """The directory's weights as a phi3 GGUF, as llama.cpp's converter names them (no row is permuted)."""
    tensors = {}
    for name, weights in load_file(directory / "model.safetensors").items():
        name = name.removeprefix("model.")
        if name.startswith("layers."):
            _, layer, *part, kind = name.split(".")
            tensors[f"blk.{layer}.{_NAMES['.'.join(part)]}.{kind}"] = weights
        else:
            tensors[{"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]] = weights
    vocab, hidden = tensors["token_embd.weight"].shape
    return write_decoder_gguf(path, "phi3", tensor_type, hidden=hidden, ffn=tensors["blk.0.ffn_up.weight"].shape[0] // 2,
                              heads=4, kv_heads=2, tensors=tensors, vocab_size=vocab, fused=True, **options)


def phi3_longrope_options(**overrides) -> dict:
    """What convert_hf_to_gguf.py writes for PHI4_MINI_LIKE: the rotary dims, the factors as tensors, the
    original length, and the attention factor it computes from max_position_embeddings / that length."""
    scale = PHI4_MINI_LIKE["max_position_embeddings"] / ORIGINAL
    return {"rotary_dim": 12,
            "extra_tensors": {"rope_factors_long.weight": np.array(LONGROPE["long_factor"], np.float32),
                              "rope_factors_short.weight": np.array(LONGROPE["short_factor"], np.float32)},
            "phi3.rope.scaling.original_context_length": ORIGINAL,
            "phi3.rope.scaling.attn_factor": math.sqrt(1 + math.log(scale) / math.log(ORIGINAL)),
            **overrides}


@pytest.mark.parametrize("tensor_type", [T.F32, T.Q8_0], ids=lambda t: t.name)
def test_partial_rotary_longrope_and_window_equal_transformers_on_the_hf_directory(tmp_path: Path,
                                                                                  tensor_type: T) -> None:
    import transformers

    directory = make_hf_model_dir("phi3", tmp_path / "hf", **PHI4_MINI_LIKE)
    options = phi3_longrope_options(**{"phi3.attention.sliding_window": 256})
    path = gguf_from_phi3_dir(directory, tmp_path / f"m.{tensor_type.name}.gguf", tensor_type, **options)
    config = load_model(str(path), "float32", "cpu").config
    hf_config = load_model(str(directory), "float32", "cpu").config
    assert config.rotary_dim == hf_config.rotary_dim == 12 and config.max_position_embeddings == 256
    scaling, hf_scaling = config.rope_scaling, hf_config.rope_scaling
    for name in ("short_factor", "long_factor"):  # float32 in the file, as transformers makes them a float32 tensor
        assert np.array_equal(np.float32(getattr(scaling, name)), np.float32(getattr(hf_scaling, name)))
    assert scaling.original_max_position_embeddings == hf_scaling.original_max_position_embeddings == ORIGINAL
    assert scaling.attention_factor == pytest.approx(hf_scaling.attention_factor, rel=1e-7)  # float32 in the file
    for long in (False, True):
        torch.testing.assert_close(inverse_frequencies(12, config.rope_theta, scaling, long),
                                   inverse_frequencies(12, hf_config.rope_theta, hf_scaling, long), rtol=0, atol=0)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert_greedy_equals(path, reference, "gguf" if tensor_type == T.Q8_0 else "none")  # sequences under 64


def test_attention_factor_defaults_to_transformers_rule_without_its_key(tmp_path: Path) -> None:
    options = phi3_longrope_options()
    del options["phi3.rope.scaling.attn_factor"]
    path = write_decoder_gguf(tmp_path / "m.gguf", "phi3", hidden=64, ffn=64, fused=True, **options, **PAD)
    scaling = load_model(str(path), "float32", "cpu").config.rope_scaling
    # write_decoder_gguf's context_length is 512: factor 512 / 64 = 8
    assert scaling.factor == 8 and scaling.attention_factor == math.sqrt(1 + math.log(8) / math.log(ORIGINAL))


@pytest.mark.parametrize(("arch", "options", "message"), [
    ("phi3", phi3_longrope_options(**{"phi3.rope.scaling.original_context_length": None}),
     "m.gguf: LongRoPE needs phi3.rope.scaling.original_context_length, which the file lacks"),
    ("phi3", phi3_longrope_options(extra_tensors={"rope_factors_short.weight": np.ones(6, np.float32)}),
     "m.gguf: LongRoPE needs rope_factors_long.weight, which the file lacks"),
    ("phi3", phi3_longrope_options(extra_tensors={"rope_factors_short.weight": np.ones(5, np.float32),
                                                  "rope_factors_long.weight": np.ones(6, np.float32)}),
     r"rope_factors_short.weight must be 6 positive float32 values \(one per rotary frequency\), got F32 \[5\]"),
    ("qwen2", {"extra_tensors": {"rope_factors_short.weight": np.ones(8, np.float32)}},
     "m.gguf: LongRoPE's rope_factors tensors are read in phi3 files only, not 'qwen2' ones"),
    ("qwen2", {"rotary_dim": 12}, r"m.gguf: RoPE over 12 of 16 head dimensions \(partial rotary\) is not supported"),
])
def test_a_longrope_or_partial_rotary_it_cannot_run_is_refused_by_name(tmp_path: Path, arch, options, message) -> None:
    options = {k: v for k, v in options.items() if v is not None}
    path = write_decoder_gguf(tmp_path / "m.gguf", arch, hidden=64, ffn=64, fused=arch == "phi3", **options)
    with pytest.raises(UnsupportedModelError, match=message):
        load_model(str(path))
