"""load_gguf: a llama.cpp `.gguf` file (Llama architecture) to a ready DecoderModel.

GGUF is how llama.cpp and Ollama users hold their models: one file with the weights (often
quantized), the config as `llama.*` metadata and the tokenizer as `tokenizer.ggml.*` metadata. The
runtime computes in float32/bfloat16/float16 only, so every weight is dequantized once, at load, with
the `gguf` package, then renamed to its Hugging Face name and handed to the same state-dict loader
as a Hugging Face directory. Everything but the weights (the file's checks, its config and tokenizer) is
gguf_meta.py's, torch-free, so that a multi-model server sizes and checks a GGUF without loading it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from .config import ModelConfig, UnsupportedModelError
from .gguf_file import GGUFModel
from .gguf_meta import SUPPORTED_TYPES, is_gguf, read_gguf, served_name
from .llama import DecoderModel
from .tokenizer import Tokenizer

__all__ = ["SUPPORTED_TYPES", "is_gguf", "load_gguf", "served_name"]

log = logging.getLogger(__name__)

# GGUF tensor names -> Hugging Face names (blk.N. -> model.layers.N.)
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def load_gguf(path: Path, torch_type: torch.dtype, device: str) -> tuple[DecoderModel, Tokenizer, ModelConfig, str]:
    """(model, tokenizer, config, served name). Raises UnsupportedModelError naming what cannot be
    read: the architecture, a tensor type, the tokenizer or its pre-tokenizer."""
    gg, config, tokenizer = read_gguf(path)

    with torch.device("meta"):
        net = DecoderModel(config).to(torch_type)  # dtype on meta first: memory is taken once, in the final dtype
    net = net.to_empty(device=device)
    net.load_hf_state_dict(_hf_tensors(gg, config))
    return net.eval(), tokenizer, config, served_name(path)


def _hf_tensors(gg: GGUFModel, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 CPU tensor), dequantized one at a time."""
    for t in gg.tensors:
        name = _hf_name(t.name)
        weights = dequantize(t.data, GGMLQuantizationType(t.type_id))  # numpy order: (out_features, in_features)
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            weights = _unpermute(weights, config.num_heads)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            weights = _unpermute(weights, config.num_kv_heads)
        yield name, torch.from_numpy(np.array(weights, dtype=np.float32))  # a copy: the file is mapped read-only


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_TENSOR.fullmatch(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise UnsupportedModelError(f"GGUF tensor {name!r} is not part of a Llama model: the file does not match its architecture")
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def _unpermute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's convert-time permutation of Q and K rows, which turns Hugging Face's
    rotate-half RoPE layout (halves) into GGML's interleaved pairs; the runtime rotates halves."""
    half = weights.shape[0] // num_heads // 2
    return weights.reshape(num_heads, half, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)
