"""RoPE scaling in llama GGUF files: Llama 3's (a `rope_freqs` tensor, as llama.cpp's converter writes it for
Llama 3.1 and 3.2) and linear (`rope.scaling.type` and `rope.scaling.factor`), against transformers on the Hugging
Face directory the test writes the GGUF from (transformers' GGUF loader ignores both); and a type still
unsupported (yarn, longrope) refused by name, exit 2 from the CLI.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flotilla_server.model import UnsupportedModelError, load_model
from flotilla_server.model.rope import inverse_frequencies
from safetensors.numpy import load_file

from tests.support.hf_models import make_hf_model_dir

from .test_gguf_qwen import assert_cli_refuses, assert_greedy_equals, write_decoder_gguf

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16  # make_hf_model_dir's: hidden 64, 4 heads, 2 KV heads
# the band Llama 3's rule interpolates lies within the test's positions: wavelengths under 8 kept, over 32 slowed 8x
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def llama_cpp_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: Hugging Face's rotate-half rows to GGML's interleaved pairs."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def llama3_rope_freqs(theta: float, scaling: dict) -> np.ndarray:
    """The `rope_freqs` tensor convert_hf_to_gguf.py writes for `rope_type: llama3`: each frequency's divisor."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    freqs = 1.0 / (theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    divisors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            divisors.append(1.0)
        elif wavelen > old_len / low:
            divisors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, np.float32)


def gguf_from_hf_dir(directory: Path, path: Path, **options) -> Path:
    """The directory's weights as a llama GGUF (names mapped, Q and K permuted as llama.cpp does)."""
    tensors = {}
    for name, weights in load_file(directory / "model.safetensors").items():
        name = name.removeprefix("model.")
        if name.startswith("layers."):
            _, layer, *part, kind = name.split(".")
            gguf_name = f"blk.{layer}.{_NAMES['.'.join(part)]}.{kind}"
            if part[-1] in ("q_proj", "k_proj"):
                weights = llama_cpp_permute(weights, HEADS if part[-1] == "q_proj" else KV_HEADS)
        else:
            gguf_name = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                         "lm_head.weight": "output.weight"}[name]
        tensors[gguf_name] = weights
    vocab, hidden = tensors["token_embd.weight"].shape
    return write_decoder_gguf(path, "llama", hidden=hidden, ffn=tensors["blk.0.ffn_up.weight"].shape[0], heads=HEADS,
                              kv_heads=KV_HEADS, tensors=tensors, vocab_size=vocab, **options)


@pytest.mark.parametrize("kind", ["llama3", "linear"])
def test_rope_scaling_equals_transformers_on_the_hf_directory(tmp_path: Path, kind: str) -> None:
    import transformers

    scaling = LLAMA3 if kind == "llama3" else {"rope_type": "linear", "factor": 4.0}
    directory = make_hf_model_dir("llama", tmp_path / "hf", rope_scaling=scaling)
    theta = json.loads((directory / "config.json").read_text()).get("rope_theta", 10000.0)
    if kind == "llama3":
        options = {"rope_freqs": llama3_rope_freqs(theta, scaling)}
    else:
        options = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": scaling["factor"]}
    path = gguf_from_hf_dir(directory, tmp_path / f"m-{kind}.gguf", **options)
    config = load_model(str(path), "float32", "cpu").config
    assert config.rope_scaling is not None and config.rope_theta == theta
    scaled = inverse_frequencies(HEAD_DIM, theta, config.rope_scaling)
    hf_scaled = inverse_frequencies(HEAD_DIM, theta, load_model(str(directory), "float32", "cpu").config.rope_scaling)
    torch.testing.assert_close(scaled, hf_scaled, rtol=1e-6, atol=0)  # llama.cpp's divisors: transformers' rule
    assert not torch.equal(scaled, inverse_frequencies(HEAD_DIM, theta, None))
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert_greedy_equals(path, reference)


@pytest.mark.parametrize("kind", ["yarn", "longrope"])
def test_an_unsupported_rope_scaling_type_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    path = write_decoder_gguf(tmp_path / "m.gguf", "qwen2", qkv_bias=True, **{"qwen2.rope.scaling.type": kind})
    message = (f"m.gguf: GGUF RoPE scaling type '{kind}' is not supported: Flotilla runs none, linear and Llama 3's "
               "(a rope_freqs tensor)")
    with pytest.raises(UnsupportedModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(str(path))
    if kind == "yarn":
        assert_cli_refuses(path, message)


def test_a_rope_freqs_tensor_of_the_wrong_length_is_refused(tmp_path: Path) -> None:
    path = write_decoder_gguf(tmp_path / "m.gguf", "llama", rope_freqs=np.ones(3, np.float32))
    with pytest.raises(UnsupportedModelError, match=r"rope_freqs.weight must be 32 float32 values"):
        load_model(str(path))
