"""Everything a `.gguf` file holds but its weights, read and checked in a tenth of a second, torch-free.

The loader (gguf_loader.py) reads a GGUF in two parts: this one (the file, its architecture and tensor
types, the config and the tokenizer from its metadata), then the weights, dequantized with torch. A
multi-model server runs only this part before a load, to size the model in its memory budget and to refuse
a file it could never load (model/source.py), without importing torch into its HTTP process. Only the
tensor types listed in SUPPORTED_TYPES are read; any other is refused by name rather than trusted to a
dequantizer nobody here has checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from .config import ModelConfig, RopeScaling, UnsupportedModelError
from .gguf_file import GGUFModel
from .gguf_tokenizer import tokenizer_from_gguf
from .moe_config import MoeConfig
from .tokenizer import Tokenizer

T = GGMLQuantizationType
# the types `--quantization gguf` keeps in their blocks on CPU (model/quant_blocks.py has their products: native
# kernels for Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K, a torch fallback for the others; the k-quants in
# super-blocks of 256 weights); F32, F16 and BF16 are dequantized at load
BLOCK_KERNEL_TYPES = frozenset({T.Q8_0, T.Q5_0, T.Q5_1, T.Q4_0, T.Q4_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K})
SUPPORTED_TYPES = frozenset({T.F32, T.F16, T.BF16}) | BLOCK_KERNEL_TYPES
# the runtime's projections (model/llama.py) and the GGUF tensors of their parts, in output order: a
# projection keeps blocks only when every part's type has a kernel (phi3 files fuse some: projection_parts)
PROJECTION_PARTS = {"self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"), "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
                    "self_attn.o_proj": ("attn_output",), "mlp.down_proj": ("ffn_down",)}
# `llama` with `llama.expert_count` > 0 is Mixtral as llama.cpp converts it; qwen3moe is Qwen3-MoE
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe")
# a sparse layer's router (a projection like the others) and its experts' 3-D tensors [E, rows, columns]
ROUTER_PARTS = {"mlp.router": ("ffn_gate_inp",)}
EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# llama.cpp's Gemma 3 (llama-model.cpp): every 6th layer global, the others a sliding window of
# `attention.sliding_window` keys rotated by an unscaled base of 10,000; scores scaled by head_dim ** -0.5,
# but by (hidden / heads) ** -0.5 in the 27B model, its only one of 62 layers
GEMMA3_GLOBAL_EVERY = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0
GEMMA3_27B_LAYERS = 62
# llama.cpp's `rope.scaling.type` values the runtime runs: none, and linear (positions divided by a factor);
# Llama 3's scaling has no type there, only a `rope_freqs` tensor (each frequency's divisor)
SUPPORTED_ROPE_SCALING = ("none", "linear")
ROPE_FREQS = "rope_freqs.weight"
# phi3's LongRoPE (llama.cpp's converter writes the Hugging Face config's short_factor and long_factor here)
ROPE_FACTORS_SHORT, ROPE_FACTORS_LONG = "rope_factors_short.weight", "rope_factors_long.weight"
# file-name suffixes that name a quantization, not the model (SmolLM2-135M-Instruct.Q4_1.gguf)
_QUANT_SUFFIX = re.compile(r"[.-](f32|f16|bf16|q\d\w*|iq\d\w*)$", re.IGNORECASE)


def is_gguf(model: str) -> bool:
    return model.lower().endswith(".gguf")


def read_gguf(path: Path) -> tuple[GGUFModel, ModelConfig, Tokenizer]:
    """(file, config, tokenizer). Raises FileNotFoundError, or a ValueError (UnsupportedModelError,
    GGUFFormatError) naming what cannot be read: the format, the architecture, a tensor type, the tokenizer
    or its pre-tokenizer."""
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found: pass --model with the path of a .gguf file")
    gg = GGUFModel(path)
    if gg.architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {gg.architecture!r} is not supported: Flotilla loads GGUF files of "
            f"architecture {', '.join(SUPPORTED_ARCHITECTURES)}; use a Hugging Face directory instead"
        )
    _check_tensor_types(gg)
    return gg, gguf_config(gg), tokenizer_from_gguf(gg)


def served_name(path: Path) -> str:
    """The file's name without `.gguf` and its quantization suffix, lowercased:
    SmolLM2-135M-Instruct.Q4_1.gguf -> smollm2-135m-instruct."""
    return _QUANT_SUFFIX.sub("", path.name.removesuffix(".gguf")).lower()


def projection_parts(architecture: str, tensor_names: Collection[str]) -> dict[str, tuple[str, ...]]:
    """PROJECTION_PARTS as this file holds them. phi3 files hold gate and up as one `ffn_up` (gate rows first:
    the runtime's gate_up_proj, as transformers maps it), and Q, K, V as one `attn_qkv` where present
    (llama.cpp also reads them apart)."""
    if architecture != "phi3":
        return PROJECTION_PARTS
    qkv = ("attn_qkv",) if "blk.0.attn_qkv.weight" in tensor_names else PROJECTION_PARTS["self_attn.qkv_proj"]
    return {**PROJECTION_PARTS, "self_attn.qkv_proj": qkv, "mlp.gate_up_proj": ("ffn_up",)}


def layer_projection_parts(config: ModelConfig, layer: int, architecture: str,
                           tensor_names: Collection[str]) -> dict[str, tuple[str, ...]]:
    """`projection_parts` of one layer: a sparse layer (config.is_sparse) has its router where a dense one has
    its MLP's projections (its experts are EXPERT_PARTS, held apart)."""
    parts = projection_parts(architecture, tensor_names)
    if not config.is_sparse(layer):
        return parts
    return {**{k: v for k, v in parts.items() if not k.startswith("mlp.")}, **ROUTER_PARTS}


def gguf_config(gg: GGUFModel) -> ModelConfig:
    """Maps `{architecture}.*` metadata to ModelConfig; refuses RoPE variants the runtime does not run. The
    optional parts come from the tensors present, as llama.cpp reads them: Q/K/V biases (Qwen2), Q/K norms
    (Qwen3), an output bias, no `output.weight` (tied embeddings), the sparse layers (those with a router,
    `ffn_gate_inp`: qwen3moe, and llama files with experts: Mixtral). phi3: a partial rotary from
    `rope.dimension_count`, and every layer windowed by `attention.sliding_window` (0: none), as config.py
    windows a Hugging Face Phi-3's."""
    tokens = gg.field("tokenizer.ggml.tokens") or []
    hidden = int(gg.arch_field("embedding_length"))
    num_heads = int(gg.arch_field("attention.head_count"))
    head_dim = int(gg.arch_field("attention.key_length", hidden // num_heads))
    eos = gg.field("tokenizer.ggml.eos_token_id")
    bos = gg.field("tokenizer.ggml.bos_token_id")
    names = {t.name for t in gg.tensors}
    num_layers = int(gg.arch_field("block_count"))
    # the architectures' own fields: phi3's windows; Gemma 3's (its windows included)
    own = {"layer_windows": _phi3_windows(gg, num_layers)} if gg.architecture == "phi3" else {}
    if gg.architecture == "gemma3":
        own = _gemma3_fields(gg, hidden, num_heads, head_dim, num_layers)
    moe = MoeConfig.from_gguf(gg.architecture, gg.file.fields)
    if moe is not None:  # as llama.cpp, the layers with a router are the sparse ones
        moe = replace(moe, mlp_only_layers=tuple(i for i in range(num_layers)
                                                 if f"blk.{i}.ffn_gate_inp.weight" not in names))
    elif gg.architecture == "qwen3moe":
        raise UnsupportedModelError(f"{gg.path.name}: a qwen3moe file needs qwen3moe.expert_count > 0: the file is "
                                    "damaged or was written by an older converter")
    return ModelConfig(
        model_type=gg.architecture,
        vocab_size=int(gg.arch_field("vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(gg.arch_field("feed_forward_length")),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(gg.arch_field("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        max_position_embeddings=int(gg.arch_field("context_length", 2048)),
        rms_norm_eps=float(gg.arch_field("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gg.arch_field("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling(gg, head_dim),
        qkv_bias="blk.0.attn_q.bias" in names,
        o_bias="blk.0.attn_output.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
        rotary_dim=int(gg.arch_field("rope.dimension_count", head_dim)),
        moe=moe,
        **own,
    )


def _phi3_windows(gg: GGUFModel, num_layers: int) -> tuple[int, ...]:
    """phi3's `attention.sliding_window` (0 or absent: none) windows every layer, as llama.cpp and transformers
    apply it."""
    window = int(gg.arch_field("attention.sliding_window", 0))
    return (window,) * num_layers if window > 0 else ()


def _gemma3_fields(gg: GGUFModel, hidden: int, num_heads: int, head_dim: int, num_layers: int) -> dict:
    """The ModelConfig fields of a Gemma 3 file, as llama.cpp runs it (its layer pattern, local RoPE base and
    score scale are code there, not metadata); the file's norm weights hold 1 + weight (gguf_loader
    subtracts the 1, as transformers' GGUF reader does, and the runtime adds it back)."""
    window = int(gg.arch_field("attention.sliding_window", 0))
    if window < 1:
        raise UnsupportedModelError(f"{gg.path.name}: gemma3.attention.sliding_window is missing or < 1: the "
                                    "file is damaged or was written by an older converter")
    scale_dim = hidden / num_heads if num_layers == GEMMA3_27B_LAYERS else head_dim
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "norm_weight_offset": 1.0,
        "sandwich_norms": True,
        "embedding_scale": hidden ** 0.5,
        "attention_scale": float(scale_dim) ** -0.5,
        "layer_windows": tuple(0 if (i + 1) % GEMMA3_GLOBAL_EVERY == 0 else window for i in range(num_layers)),
        "local_rope_theta": GEMMA3_LOCAL_ROPE_THETA,
    }


def rope_scaling(gg: GGUFModel, head_dim: int) -> RopeScaling | None:
    """The file's RoPE scaling: `rope.scaling.type` linear (`rope.scaling.factor`), a `rope_freqs` tensor
    (Llama 3.1 and 3.2 files: llama.cpp divides each frequency by its entry, and with linear scaling by the
    factor too), and phi3's LongRoPE (`rope_factors_short`/`_long` tensors). Refuses, by name, a type the
    runtime does not run (yarn; longrope outside phi3) and a partial rotary outside phi3."""
    kind = str(gg.arch_field("rope.scaling.type", "none"))
    rotary = int(gg.arch_field("rope.dimension_count", head_dim))
    has_factors = any(t.name in (ROPE_FACTORS_SHORT, ROPE_FACTORS_LONG) for t in gg.tensors)
    if gg.architecture == "phi3" and (has_factors or kind == "longrope"):
        return _longrope(gg, rotary)
    if kind not in SUPPORTED_ROPE_SCALING:
        raise UnsupportedModelError(
            f"{gg.path.name}: GGUF RoPE scaling type {kind!r} is not supported: Flotilla runs "
            f"{', '.join(SUPPORTED_ROPE_SCALING)} and Llama 3's (a rope_freqs tensor); use a file without it"
        )
    if has_factors:
        raise UnsupportedModelError(f"{gg.path.name}: LongRoPE's rope_factors tensors are read in phi3 files only, "
                                    f"not {gg.architecture!r} ones; use the model's Hugging Face directory")
    if rotary != head_dim and gg.architecture != "phi3":
        raise UnsupportedModelError(f"{gg.path.name}: RoPE over {rotary} of {head_dim} head dimensions (partial "
                                    "rotary) is not supported for GGUF files; use the model's Hugging Face directory")
    factor = float(gg.arch_field("rope.scaling.factor", 1.0)) if kind == "linear" else 1.0
    if not (factor > 0 and np.isfinite(factor)):
        raise UnsupportedModelError(f"{gg.path.name}: rope.scaling.factor must be a positive number, got {factor}")
    freqs = next((t for t in gg.tensors if t.name == ROPE_FREQS), None)
    if freqs is None:
        return None if kind == "none" else RopeScaling("linear", factor)
    if freqs.type_id != T.F32 or freqs.shape != (head_dim // 2,):
        raise UnsupportedModelError(f"{gg.path.name}: {ROPE_FREQS} must be {head_dim // 2} float32 values (one per "
                                    f"frequency), got {freqs.type_name} {list(freqs.shape)}: the file is damaged")
    divisors = tuple(float(v) * factor for v in freqs.data.view(np.float32))
    if not all(v > 0 and np.isfinite(v) for v in divisors):
        raise UnsupportedModelError(f"{gg.path.name}: {ROPE_FREQS} holds a value that is not a positive number")
    return RopeScaling("rope_freqs", 1.0, freq_divisors=divisors)


def _longrope(gg: GGUFModel, rotary: int) -> RopeScaling:
    """phi3's LongRoPE as llama.cpp's converter writes it: the factors as tensors of rotary / 2 float32 values,
    the pretraining length as `rope.scaling.original_context_length`, and the attention factor as
    `rope.scaling.attn_factor` (where absent, transformers' default from context_length / that length)."""
    tensors = {t.name: t for t in gg.tensors if t.name in (ROPE_FACTORS_SHORT, ROPE_FACTORS_LONG)}
    original = gg.arch_field("rope.scaling.original_context_length")
    missing = [n for n in (ROPE_FACTORS_SHORT, ROPE_FACTORS_LONG) if n not in tensors]
    missing += ["phi3.rope.scaling.original_context_length"] if original is None else []
    if missing:
        raise UnsupportedModelError(f"{gg.path.name}: LongRoPE needs {', '.join(missing)}, which the file lacks: "
                                    "convert the model again with llama.cpp's convert_hf_to_gguf.py")
    factors = []
    for t in (tensors[ROPE_FACTORS_SHORT], tensors[ROPE_FACTORS_LONG]):
        values = tuple(float(v) for v in t.data.view(np.float32)) if t.type_id == T.F32 else ()
        if len(values) != rotary // 2 or t.shape != (rotary // 2,) or not all(v > 0 and math.isfinite(v) for v in values):
            raise UnsupportedModelError(f"{gg.path.name}: {t.name} must be {rotary // 2} positive float32 values (one "
                                        f"per rotary frequency), got {t.type_name} {list(t.shape)}: the file is damaged")
        factors.append(values)
    original = int(original)
    factor = int(gg.arch_field("context_length", 2048)) / original
    attention = gg.arch_field("rope.scaling.attn_factor")
    if attention is None:  # transformers' default
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling("longrope", factor, original_max_position_embeddings=original, short_factor=factors[0],
                       long_factor=factors[1], attention_factor=float(attention))


def _check_tensor_types(gg: GGUFModel) -> None:
    unsupported = sorted({t.type_name for t in gg.tensors if t.type_id not in SUPPORTED_TYPES})
    if unsupported:
        raise UnsupportedModelError(
            f"{gg.path.name} holds tensors of type {', '.join(unsupported)}, which Flotilla does not "
            f"dequantize; supported: {', '.join(sorted(t.name for t in SUPPORTED_TYPES))}. "
            "Use a file of one of these quantizations"
        )
