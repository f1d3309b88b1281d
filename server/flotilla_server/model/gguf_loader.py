"""load_gguf: a llama.cpp `.gguf` file (architecture llama, qwen2, qwen3, gemma3, phi3 or qwen3moe) to a ready
DecoderModel.

GGUF is how llama.cpp and Ollama users hold their models: one file with the weights (often
quantized), the config as `{architecture}.*` metadata and the tokenizer as `tokenizer.ggml.*` metadata.
The architectures are one decoder here (model/llama.py): Qwen2 adds Q/K/V biases, Qwen3 Q/K norms, Gemma 3
its four norms a layer (whose weights llama.cpp's converter stored as 1 + weight), phi3 holds Q/K/V and
gate/up fused as the runtime does (`attn_qkv`, `ffn_up`), and only llama.cpp's `llama` conversion permutes
the Q and K rows (its other converters keep Hugging Face's). Qwen3-MoE (qwen3moe) and Mixtral (llama with
experts) hold a router (`ffn_gate_inp`) and 3-D expert tensors (`ffn_gate_exps`, `ffn_up_exps`,
`ffn_down_exps`) in their sparse layers.

With `quantization="gguf"` (the default for a GGUF on CPU) every projection and the token embedding whose
type has a kernel (gguf_meta.BLOCK_KERNEL_TYPES) keep the file's blocks (quant_linear.py); the rest (the
norms, and types without a kernel yet) are dequantized once, at load, with the `gguf` package, renamed to
their Hugging Face names and handed to the same state-dict loader as a Hugging Face directory. A sparse layer's
router is a projection like the others; its experts keep their blocks (quant_experts.QuantizedExperts) when all
three expert tensors are of types with a kernel, else all three are dequantized (logged, as other types are). With
`quantization="none"`, and on a GPU, everything is dequantized that way; so it is with `int8` and `fp8`,
which loader.py then requantizes (DecoderModel.to_int8, to_fp8) once this returns. Everything but the weights (the
file's checks, its config and tokenizer) is gguf_meta.py's, torch-free, so that a multi-model server sizes
and checks a GGUF without loading it.
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
from torch import nn

from .config import ModelConfig, UnsupportedModelError
from .gguf_file import GGUFModel, TensorInfo
from .gguf_meta import (
    BLOCK_KERNEL_TYPES,
    EXPERT_PARTS,
    ROPE_FACTORS_LONG,
    ROPE_FACTORS_SHORT,
    ROPE_FREQS,
    SUPPORTED_TYPES,
    is_gguf,
    layer_projection_parts,
    read_gguf,
    served_name,
)
from .llama import DecoderModel
from .quant_experts import QuantizedExperts
from .quant_linear import QuantizedEmbedding, QuantizedLinear
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
    "attn_q_norm": "self_attn.q_norm",  # Qwen3, Gemma 3
    "attn_k_norm": "self_attn.k_norm",
    "attn_qkv": "self_attn.qkv_proj",  # phi3: Q, K and V rows in one tensor, the runtime's fused layout
    "ffn_gate_inp": "mlp.gate",  # a sparse layer's router
}
# a sparse layer's 3-D expert tensors, by the stacked names moe_weights.py reads (one part each, no `.weight`)
_EXPERT_NAMES = {"ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
                 "ffn_down_exps": "mlp.experts.down_proj"}
# per architecture, the layer tensors whose names differ from Llama's: Gemma 3's norms around both sublayers
# (llama.cpp's `ffn_norm` is the MLP's input norm, as in Llama, which Gemma's transformers code calls
# pre_feedforward_layernorm); phi3's ffn_up, gate rows then up rows
_ARCH_LAYER_NAMES = {
    "gemma3": {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"ffn_up": "mlp.gate_up_proj"},
}
# tensors the config already holds (gguf_meta.rope_scaling), not weights
_CONFIG_TENSORS = frozenset({ROPE_FREQS, ROPE_FACTORS_SHORT, ROPE_FACTORS_LONG})
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def load_gguf(path: Path, torch_type: torch.dtype, device: str,
              quantization: str = "gguf") -> tuple[DecoderModel, Tokenizer, ModelConfig, str]:
    """(model, tokenizer, config, served name). Raises UnsupportedModelError naming what cannot be
    read: the architecture, a tensor type, the tokenizer or its pre-tokenizer."""
    gg, config, tokenizer = read_gguf(path)
    with torch.device("meta"):
        net = DecoderModel(config).to(torch_type)  # dtype on meta first: memory is taken once, in the final dtype
    net = net.to_empty(device=device)  # not touched, so not resident, where blocks replace a weight below
    kept: set[str] = set()
    if quantization == "gguf" and device != "cpu":
        log.info("%s: GGUF blocks are dequantized to %s on %s (the block kernels are CPU kernels)",
                 path.name, str(torch_type).removeprefix("torch."), device)
    elif quantization == "gguf":
        kept = keep_blocks(net, gg, config, torch_type)
    net.load_hf_state_dict(_hf_tensors(gg, config, skip=kept))
    return net.eval(), tokenizer, config, served_name(path)


def keep_blocks(net: DecoderModel, gg: GGUFModel, config: ModelConfig, torch_type: torch.dtype) -> set[str]:
    """Swaps in quantized modules for every projection (all its parts of a type with a kernel) and for the
    embedding (and head) of such a type; returns the GGUF tensor names they hold."""
    by_name = {t.name: t for t in gg.tensors}
    kept: set[str] = set()
    dequantized = sorted({t.type_name for t in gg.tensors if len(t.shape) >= 2 and t.type_id not in BLOCK_KERNEL_TYPES})
    if dequantized:
        log.info("%s: tensors of type %s are dequantized to %s at load (no block kernel for them yet)",
                 gg.path.name, ", ".join(dequantized), str(torch_type).removeprefix("torch."))
    embedding = by_name["token_embd.weight"]
    if embedding.type_id in BLOCK_KERNEL_TYPES:
        net.embed_tokens = QuantizedEmbedding(_blocks(embedding), embedding.type_id, config.hidden_size, torch_type)
        kept.add(embedding.name)
    head = by_name.get("output.weight")
    if head is not None and net.lm_head is not None and head.type_id in BLOCK_KERNEL_TYPES:
        net.lm_head = QuantizedLinear(config.hidden_size, [(_blocks(head), head.type_id)], dtype=torch_type)
        kept.add(head.name)
    for i, layer in enumerate(net.layers):
        if config.is_sparse(i):
            kept |= _keep_expert_blocks(layer.mlp, i, by_name)
        for target, parts in layer_projection_parts(config, i, gg.architecture, by_name).items():
            tensors = [by_name[f"blk.{i}.{part}.weight"] for part in parts]
            if any(t.type_id not in BLOCK_KERNEL_TYPES for t in tensors):
                continue
            owner_name, attr = target.split(".")
            owner = getattr(layer, owner_name)
            dense = getattr(owner, attr)
            blocks = [(_blocks(t, _heads_of(t.name, config)), t.type_id) for t in tensors]
            bias = None if dense.bias is None else torch.empty_like(dense.bias, device="cpu")  # the state dict fills it
            setattr(owner, attr, QuantizedLinear(dense.in_features, blocks, bias, torch_type))
            kept.update(t.name for t in tensors)
    return kept


def _keep_expert_blocks(block: nn.Module, layer: int, by_name: dict[str, TensorInfo]) -> set[str]:
    """Swaps in QuantizedExperts for the block's experts when all three expert tensors are of types with a
    kernel; returns the names it holds (none: they are dequantized with the rest)."""
    tensors = [by_name[f"blk.{layer}.{part}.weight"] for part in EXPERT_PARTS]
    if any(t.type_id not in BLOCK_KERNEL_TYPES for t in tensors):
        return set()
    block.experts = QuantizedExperts(*[(_blocks(t), t.type_id) for t in tensors])
    return {t.name for t in tensors}


def _heads_of(name: str, config: ModelConfig) -> int | None:
    """The head count whose rows llama.cpp permuted in this tensor (Q and K of a `llama` file), else None."""
    if config.model_type != "llama":
        return None
    part = name.split(".")[-2]
    return {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}.get(part)


def _blocks(t: TensorInfo, permuted_heads: int | None = None) -> torch.Tensor:
    """The tensor's blocks as a uint8 [rows, bytes per row] copy (the file is mapped read-only), Q/K rows
    put back in the runtime's order."""
    data = t.data if permuted_heads is None else _unpermute(t.data, permuted_heads)
    return torch.from_numpy(np.array(data, order="C"))  # one copy, in the runtime's row order


def _hf_tensors(gg: GGUFModel, config: ModelConfig, skip: set[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 CPU tensor), dequantized one at a time; the GGUF names in `skip` are held
    as blocks already."""
    for t in gg.tensors:
        if t.name in skip or t.name in _CONFIG_TENSORS:
            continue
        name = _expert_name(t.name) or _hf_name(t.name, gg.architecture)
        weights = dequantize(t.data, GGMLQuantizationType(t.type_id))  # numpy order: (out_features, in_features)
        heads = _heads_of(t.name, config)
        if heads is not None:
            weights = _unpermute(weights, heads)
        if config.norm_weight_offset and t.name.endswith("norm.weight"):
            weights = weights - np.float32(config.norm_weight_offset)  # the file holds offset + weight
        yield name, torch.from_numpy(np.array(weights, dtype=np.float32))  # a copy: the file is mapped read-only


def _hf_name(name: str, architecture: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_TENSOR.fullmatch(name)
    names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(architecture, {})}
    if m is None or m.group(2) not in names:
        raise UnsupportedModelError(f"GGUF tensor {name!r} is not part of a {architecture} model as Flotilla runs it: "
                                    "the file does not match its architecture")
    layer, part, kind = m.groups()
    return f"model.layers.{layer}.{names[part]}.{kind}"


def _expert_name(name: str) -> str | None:
    """The stacked Hugging Face-style name of a 3-D expert tensor (`model.layers.N.mlp.experts.up_proj`), else
    None."""
    m = _LAYER_TENSOR.fullmatch(name)
    if m is None or m.group(2) not in _EXPERT_NAMES or m.group(3) != "weight":
        return None
    return f"model.layers.{m.group(1)}.{_EXPERT_NAMES[m.group(2)]}"


def _unpermute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's convert-time permutation of Q and K rows, which turns Hugging Face's
    rotate-half RoPE layout (halves) into GGML's interleaved pairs; the runtime rotates halves."""
    half = weights.shape[0] // num_heads // 2
    return weights.reshape(num_heads, half, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)
