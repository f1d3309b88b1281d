"""ModelConfig: the shape of a decoder, read once from a Hugging Face `config.json`.

Hugging Face configs differ by family and by transformers version (`rope_scaling` + `rope_theta`
before v5, `rope_parameters` after; Qwen2 has implicit QKV bias; Qwen3 has per-head QK norm and an
explicit `head_dim`; Gemma 3 has sliding-window layers with their own RoPE base, norms around both
sublayers that scale by 1 + weight, a GELU, scaled embeddings and its own attention scale; Phi-3/Phi-4
may rotate part of each head and scale RoPE by LongRoPE's factors). This module folds those differences
into one validated dataclass so that the model code never looks at a raw dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import UnsupportedModelError
from .moe_config import MOE_MODEL_TYPES, UNSUPPORTED_MOE, MoeConfig

# `--quantization int8`: its kernels take a layer whose in_features is a multiple of this (a row is whole
# vectors of 16 weights, AVX-512's width, on every path: model/int8_weights.py); source.check_int8 refuses others
INT8_K_MULTIPLE = 16
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", *MOE_MODEL_TYPES)
_ARCHITECTURE_OF = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",  # Phi-3 mini/medium, Phi-3.5-mini, Phi-4, Phi-4-mini
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
# the activations of the MLP's gate the runtime computes (model/llama.py MLP)
HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")
_ROPE_TYPES = ("default", "linear", "llama3")
_PHI3_ROPE_TYPES = ("default", "longrope")  # as transformers' Phi3Config, which refuses the others
_PHI3_LEGACY_ROPE_TYPES = {"su": "longrope", "yarn": "longrope"}  # early Phi-3 configs; transformers renames them


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str  # "linear", "llama3", "longrope", or "rope_freqs" (a GGUF's per-frequency divisors)
    factor: float
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3; longrope: positions from here take long_factor
    freq_divisors: tuple[float, ...] = ()  # rope_freqs only: inverse frequency i is divided by entry i
    short_factor: tuple[float, ...] = ()  # longrope only: divisors of the inverse frequencies, short positions
    long_factor: tuple[float, ...] = ()  # longrope only: the same, for positions >= original_max_position_embeddings
    attention_factor: float = 1.0  # longrope only: cos and sin are multiplied by it


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
    hidden_act: str = "silu"  # the MLP gate's activation, one of HIDDEN_ACTS
    # Gemma: every RMSNorm scales by (offset + weight), computed in float32 before the cast back
    norm_weight_offset: float = 0.0
    sandwich_norms: bool = False  # Gemma 3: attention and MLP outputs are normed too, before each residual add
    embedding_scale: float | None = None  # Gemma: embeddings are multiplied by sqrt(hidden_size)
    attention_scale: float | None = None  # the scores' scale; None: head_dim ** -0.5
    # per layer: 0 = global attention, W > 0 = a sliding window (a query sees its W latest keys, itself
    # included); () = every layer global
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float | None = None  # the sliding layers' RoPE base (unscaled); None: rope_theta
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    rotary_dim: int = 0  # RoPE rotates the first rotary_dim dims of each head (Phi's partial rotary); 0: all
    moe: MoeConfig | None = None  # Qwen3-MoE, Mixtral: the experts of the sparse layers (`is_sparse`)

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
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if self.rotary_dim % 2 or not 2 <= self.rotary_dim <= self.head_dim:
            raise UnsupportedModelError(f"RoPE must rotate an even number of dimensions from 2 to head_dim "
                                        f"({self.head_dim}), got {self.rotary_dim}: check partial_rotary_factor (a "
                                        "GGUF's rope.dimension_count)")
        if self.hidden_act not in HIDDEN_ACTS:
            raise UnsupportedModelError(f"hidden activation {self.hidden_act!r} is not supported: Flotilla runs "
                                        f"{', '.join(HIDDEN_ACTS)}")
        if self.layer_windows and (len(self.layer_windows) != self.num_layers or min(self.layer_windows) < 0):
            raise UnsupportedModelError(f"layer windows must be one size >= 0 per layer ({self.num_layers}), got "
                                        f"{list(self.layer_windows)}")
        if self.moe is not None and self.moe.hidden_size != self.hidden_size:
            raise UnsupportedModelError(f"the experts' hidden size ({self.moe.hidden_size}) must be the model's "
                                        f"({self.hidden_size})")

    def is_sparse(self, layer: int) -> bool:
        """Whether layer `layer`'s feed-forward block is a mixture of experts (else a dense MLP of
        intermediate_size)."""
        return self.moe is not None and self.moe.is_sparse(layer)

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window in keys, 0 for global attention."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> ModelConfig:
        """Reads a Hugging Face `config.json` dict; raises UnsupportedModelError with what to change."""
        model_type = hf.get("model_type")
        if model_type == "gemma3":
            raise UnsupportedModelError(
                "model_type 'gemma3' (Gemma3ForConditionalGeneration: Gemma 3 4B and larger) holds a SigLIP vision "
                "tower (vision_config) and a multi_modal_projector beside its text model, and Flotilla serves text "
                "decoders only: use a text-only checkpoint (model_type 'gemma3_text', Gemma3ForCausalLM) or the "
                "model's GGUF file, which holds the text model alone"
            )
        if model_type in UNSUPPORTED_MOE:
            raise UnsupportedModelError(
                f"model_type {model_type!r} ({UNSUPPORTED_MOE[model_type]}) is not supported: Flotilla runs the "
                f"mixture-of-experts models {', '.join(MOE_MODEL_TYPES)} (routed experts only) and the dense "
                f"{', '.join(t for t in SUPPORTED_MODEL_TYPES if t not in MOE_MODEL_TYPES)}; choose one of these"
            )
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
        if model_type == "gemma3_text":
            return _gemma3(cls, hf)
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported: only 'silu' is")

        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        head_dim = int(hf.get("head_dim") or hidden // num_heads)
        rotary_dim = _rotary_dim(hf, head_dim)
        rope_theta, rope_scaling = _rope(hf, rotary_dim)
        # Phi-3 and Mixtral have no biases (transformers reads no attention_bias for them)
        attention_bias = bool(hf.get("attention_bias", False)) and model_type not in ("phi3", "mixtral")
        return cls(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type in ("llama", "qwen3", "qwen3_moe") and attention_bias,
            mlp_bias=model_type == "llama" and bool(hf.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            layer_windows=_windows(hf, int(hf["num_hidden_layers"])),
            bos_token_id=hf.get("bos_token_id") if isinstance(hf.get("bos_token_id"), int) else None,
            eos_token_ids=token_ids(hf.get("eos_token_id")),
            rotary_dim=rotary_dim,
            moe=MoeConfig.from_hf(hf) if model_type in MOE_MODEL_TYPES else None,
        )


def _gemma3(cls: type[ModelConfig], hf: Mapping[str, Any]) -> ModelConfig:
    """Gemma 3's text model: sliding-window layers (`layer_types`, or every `sliding_window_pattern`-th layer
    global) with their own unscaled RoPE base, the global layers' base and scaling, QK norms, four norms a
    layer scaling by 1 + weight, a tanh GELU, embeddings scaled by sqrt(hidden) and scores by
    query_pre_attn_scalar ** -0.5. Both transformers v4 (`rope_theta`, `rope_local_base_freq`, `rope_scaling`)
    and v5 (`rope_parameters` per layer type) configs."""
    if hf.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError(f"attn_logit_softcapping {hf['attn_logit_softcapping']} is not supported "
                                    "(Gemma 2's score capping): Flotilla runs Gemma 3 without it")
    if hf.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention is not supported: Flotilla runs causal decoders")
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    num_layers = int(hf["num_hidden_layers"])
    layer_types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % int(hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))) == 0
        else "sliding_attention" for i in range(num_layers)]
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unknown or len(layer_types) != num_layers:
        raise UnsupportedModelError(f"layer_types must name full_attention or sliding_attention for each of the "
                                    f"{num_layers} layers, got {list(layer_types)}")
    window = int(hf.get("sliding_window") or 0)
    if window < 1 and "sliding_attention" in layer_types:
        raise UnsupportedModelError("sliding_window must be >= 1 where layer_types holds sliding_attention layers")
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:  # transformers v5
        global_params = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        if local.get("rope_type", "default") != "default":
            raise UnsupportedModelError(f"the sliding layers' rope_type {local['rope_type']!r} is not supported: "
                                        "Flotilla runs them unscaled (default)")
        local_theta = float(local.get("rope_theta", 10000.0))
    else:  # v4: top-level keys, rope_scaling for the global layers only
        global_params = {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1_000_000.0)}
        local_theta = float(hf.get("rope_local_base_freq", 10000.0))
    num_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    head_dim = int(hf.get("head_dim") or hidden // num_heads)
    rope_theta, rope_scaling = _rope({"rope_parameters": global_params}, head_dim)
    cap = hf.get("final_logit_softcapping")
    return cls(
        model_type="gemma3_text",
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=head_dim,
        max_position_embeddings=int(hf.get("max_position_embeddings", 131072)),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        qkv_bias=bool(hf.get("attention_bias", False)),
        o_bias=bool(hf.get("attention_bias", False)),
        qk_norm=True,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        bos_token_id=hf.get("bos_token_id") if isinstance(hf.get("bos_token_id"), int) else None,
        eos_token_ids=token_ids(hf.get("eos_token_id")),
        hidden_act=act,
        norm_weight_offset=1.0,
        sandwich_norms=True,
        embedding_scale=hidden ** 0.5,
        attention_scale=float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in layer_types),
        local_rope_theta=local_theta,
        final_logit_softcapping=None if cap is None else float(cap),
    )


def token_ids(value: Any) -> tuple[int, ...]:
    """An `eos_token_id` field (None, an int or a list of ints) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _windows(hf: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """Each layer's sliding window in keys (0: global; (): none), as transformers applies them: Mixtral windows
    every layer whenever `sliding_window` is set (it reads no use_sliding_window), Mistral and Phi-3 likewise
    unless `use_sliding_window` is false; Qwen2, Qwen3 and Qwen3-MoE with `use_sliding_window` the layers
    `layer_types` names, or from `max_window_layers` on."""
    window, model_type = int(hf.get("sliding_window") or 0), hf.get("model_type")
    if window < 1:
        return ()
    if model_type == "mixtral" or (model_type in ("mistral", "phi3") and hf.get("use_sliding_window", True)):
        return (window,) * num_layers
    if model_type in ("mistral", "phi3") or not hf.get("use_sliding_window"):
        return ()
    first = int(hf.get("max_window_layers", num_layers))
    types = hf.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers:
        raise UnsupportedModelError(f"layer_types must name one attention type for each of the {num_layers} layers, "
                                    f"got {len(types)}")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def _rotary_dim(hf: Mapping[str, Any], head_dim: int) -> int:
    """Phi-3's `partial_rotary_factor` (in the RoPE dict, else at the top level) as transformers applies it:
    int(head_dim * factor) leading dims of each head rotate. Other families rotate whole heads."""
    if hf.get("model_type") != "phi3":
        return head_dim
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    factor = float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if not 0 < factor <= 1:
        raise UnsupportedModelError(f"partial_rotary_factor must be in (0, 1], got {factor}")
    return int(head_dim * factor)


def _rope(hf: Mapping[str, Any], rotary_dim: int) -> tuple[float, RopeScaling | None]:
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    supported = _ROPE_TYPES
    if hf.get("model_type") == "phi3":
        rope_type, supported = _PHI3_LEGACY_ROPE_TYPES.get(rope_type, rope_type), _PHI3_ROPE_TYPES
    if rope_type not in supported:
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported for model_type {hf.get('model_type')!r}: use one of "
            f"{', '.join(supported)}"
        )
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":
        return theta, _longrope(hf, params, rotary_dim)
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


def _longrope(hf: Mapping[str, Any], params: Mapping[str, Any], rotary_dim: int) -> RopeScaling:
    """LongRoPE as transformers reads it: per-frequency short and long factors, the pretraining length (the
    top-level `original_max_position_embeddings` first, as Phi3Config gives it priority, else the RoPE dict's),
    and cos/sin scaled by `attention_factor`, by default sqrt(1 + ln(factor) / ln(original length)) where
    `factor` (default: max_position_embeddings / original length) exceeds 1."""
    original = hf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    missing = [k for k in ("short_factor", "long_factor") if not params.get(k)]
    missing += [] if original else ["original_max_position_embeddings"]
    if missing:
        raise UnsupportedModelError(f"longrope RoPE scaling needs {', '.join(missing)} in config.json; "
                                    "restore the model's original config.json")
    original = int(original)
    factors = {}
    for name in ("short_factor", "long_factor"):
        values = tuple(float(v) for v in params[name])
        if len(values) != rotary_dim // 2 or not all(v > 0 and math.isfinite(v) for v in values):
            raise UnsupportedModelError(f"longrope {name} must be {rotary_dim // 2} positive numbers (one per "
                                        f"rotary frequency), got {len(values)} values")
        factors[name] = values
    factor = params.get("factor")
    factor = float(hf.get("max_position_embeddings", 2048)) / original if factor is None else float(factor)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    if not (float(attention) > 0 and math.isfinite(float(attention))):
        raise UnsupportedModelError(f"longrope attention_factor must be a positive number, got {attention}")
    return RopeScaling("longrope", factor, original_max_position_embeddings=original,
                       attention_factor=float(attention), **factors)
