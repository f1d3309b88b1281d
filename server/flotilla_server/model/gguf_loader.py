"""load_gguf: a llama.cpp `.gguf` file (Llama architecture) to a ready DecoderModel.

GGUF is how llama.cpp and Ollama users hold their models: one file with the weights (often
quantized), the config as `llama.*` metadata and the tokenizer as `tokenizer.ggml.*` metadata. The
runtime computes in float32/bfloat16/float16 only, so every weight is dequantized once, at load, with
the `gguf` package, then renamed to its Hugging Face name and handed to the same state-dict loader
as a Hugging Face directory. Only the tensor types listed in SUPPORTED_TYPES are read; any other is
refused by name rather than trusted to a dequantizer nobody here has checked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from .config import ModelConfig, UnsupportedModelError
from .gguf_file import GGUFFile
from .gguf_tokenizer import tokenizer_from_gguf
from .llama import DecoderModel
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)

T = GGMLQuantizationType
SUPPORTED_TYPES = frozenset({T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K})
SUPPORTED_ARCHITECTURES = ("llama",)

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
# file-name suffixes that name a quantization, not the model (SmolLM2-135M-Instruct.Q4_1.gguf)
_QUANT_SUFFIX = re.compile(r"[.-](f32|f16|bf16|q\d\w*|iq\d\w*)$", re.IGNORECASE)


class GGUFModel:
    """The parts of one GGUF file the runtime needs, read without loading the tensor data."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = GGUFFile(path)
        self.tensors = self.file.tensors
        self.architecture = str(self.field("general.architecture"))

    def field(self, key: str, default: Any = None) -> Any:
        return self.file.fields.get(key, default)

    def arch_field(self, key: str, default: Any = None) -> Any:
        return self.field(f"{self.architecture}.{key}", default)


def is_gguf(model: str) -> bool:
    return model.lower().endswith(".gguf")


def load_gguf(path: Path, torch_type: torch.dtype, device: str) -> tuple[DecoderModel, Tokenizer, ModelConfig, str]:
    """(model, tokenizer, config, served name). Raises UnsupportedModelError naming what cannot be
    read: the architecture, a tensor type, the tokenizer or its pre-tokenizer."""
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found: pass --model with the path of a .gguf file")
    gg = GGUFModel(path)
    if gg.architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {gg.architecture!r} is not supported: Flotilla loads GGUF files of "
            f"architecture {', '.join(SUPPORTED_ARCHITECTURES)}; use a Hugging Face directory instead"
        )
    _check_tensor_types(gg)
    config = gguf_config(gg)
    tokenizer = tokenizer_from_gguf(gg)

    with torch.device("meta"):
        net = DecoderModel(config).to(torch_type)  # dtype on meta first: memory is taken once, in the final dtype
    net = net.to_empty(device=device)
    net.load_hf_state_dict(_hf_tensors(gg, config))
    return net.eval(), tokenizer, config, served_name(path)


def served_name(path: Path) -> str:
    """The file's name without `.gguf` and its quantization suffix, lowercased:
    SmolLM2-135M-Instruct.Q4_1.gguf -> smollm2-135m-instruct."""
    return _QUANT_SUFFIX.sub("", path.name.removesuffix(".gguf")).lower()


def gguf_config(gg: GGUFModel) -> ModelConfig:
    """Maps `llama.*` metadata to ModelConfig; refuses RoPE variants the runtime does not run."""
    scaling = gg.arch_field("rope.scaling.type", "none")
    if scaling != "none" or any(t.name == "rope_freqs.weight" for t in gg.tensors):
        raise UnsupportedModelError(
            f"{gg.path.name}: RoPE scaling ({scaling!r}, or a rope_freqs tensor) is not supported for GGUF "
            "files: use the model's Hugging Face directory instead"
        )
    tokens = gg.field("tokenizer.ggml.tokens") or []
    hidden = int(gg.arch_field("embedding_length"))
    num_heads = int(gg.arch_field("attention.head_count"))
    eos = gg.field("tokenizer.ggml.eos_token_id")
    bos = gg.field("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        model_type="llama",
        vocab_size=int(gg.arch_field("vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(gg.arch_field("feed_forward_length")),
        num_layers=int(gg.arch_field("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(gg.arch_field("attention.head_count_kv", num_heads)),
        head_dim=int(gg.arch_field("attention.key_length", hidden // num_heads)),
        max_position_embeddings=int(gg.arch_field("context_length", 2048)),
        rms_norm_eps=float(gg.arch_field("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gg.arch_field("rope.freq_base", 10000.0)),
        tie_word_embeddings=not any(t.name == "output.weight" for t in gg.tensors),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def _check_tensor_types(gg: GGUFModel) -> None:
    unsupported = sorted({t.type_name for t in gg.tensors if t.type_id not in SUPPORTED_TYPES})
    if unsupported:
        raise UnsupportedModelError(
            f"{gg.path.name} holds tensors of type {', '.join(unsupported)}, which Flotilla does not "
            f"dequantize; supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))}. "
            "Use a file of one of these quantizations"
        )


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
