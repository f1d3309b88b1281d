"""ModelConfig: the shape of a Llama-family decoder, read once from a Hugging Face `config.json`.

Hugging Face configs differ by family and by transformers version (`rope_scaling` + `rope_theta`
before v5, `rope_parameters` after; Qwen2 has implicit QKV bias; Qwen3 has per-head QK norm and an
explicit `head_dim`). This module folds those differences into one validated dataclass so that the
model code never looks at a raw dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# `--quantization int8`: its kernels take a layer whose in_features is a multiple of this (a row is whole
# vectors of 16 weights, AVX-512's width, on every path: model/int8_weights.py); source.check_int8 refuses others
INT8_K_MULTIPLE = 16
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_ARCHITECTURE_OF = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """A config that Flotilla's runtime cannot run; the message says what to change."""


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str  # "linear", "llama3", or "rope_freqs" (a GGUF's per-frequency divisors)
    factor: float
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only
    freq_divisors: tuple[float, ...] = ()  # rope_freqs only: inverse frequency i is divided by entry i


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int  # context limit this runtime honours (capped by a sliding window)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False  # Qwen2 always; Llama/Qwen3 with attention_bias
    o_bias: bool = False  # Llama/Qwen3 with attention_bias
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim of q and k, before RoPE
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise UnsupportedModelError(f"config {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> ModelConfig:
        """Reads a Hugging Face `config.json` dict; raises UnsupportedModelError with what to change."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported: Flotilla runs {', '.join(SUPPORTED_MODEL_TYPES)} "
                "decoders; choose a model of one of these families"
            )
        archs = hf.get("architectures") or [_ARCHITECTURE_OF[model_type]]
        if _ARCHITECTURE_OF[model_type] not in archs:
            raise UnsupportedModelError(
                f"architectures {archs} is not supported for model_type {model_type!r}: "
                f"expected {_ARCHITECTURE_OF[model_type]}"
            )
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported: only 'silu' is")

        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        head_dim = hf.get("head_dim") or hidden // num_heads
        rope_theta, rope_scaling = _rope(hf)
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            max_position_embeddings=_context_limit(hf),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type in ("llama", "qwen3") and attention_bias,
            mlp_bias=model_type == "llama" and bool(hf.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id") if isinstance(hf.get("bos_token_id"), int) else None,
            eos_token_ids=token_ids(hf.get("eos_token_id")),
        )


def token_ids(value: Any) -> tuple[int, ...]:
    """An `eos_token_id` field (None, an int or a list of ints) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _context_limit(hf: Mapping[str, Any]) -> int:
    """max_position_embeddings, capped by an active sliding window (the runtime attends to all keys,
    which equals sliding-window attention only while the context fits in the window)."""
    limit = int(hf.get("max_position_embeddings", 2048))
    window = hf.get("sliding_window")
    uses_window = hf.get("use_sliding_window", hf.get("model_type") == "mistral")
    if uses_window and window:
        limit = min(limit, int(window))
    return limit


def _rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported: use one of {', '.join(_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    factor = float(params["factor"])
    if not (factor > 0 and math.isfinite(factor)):
        raise UnsupportedModelError(f"rope scaling factor must be a positive number, got {factor}")
    if rope_type == "linear":
        return theta, RopeScaling("linear", factor)
    return theta, RopeScaling(
        "llama3",
        factor,
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
