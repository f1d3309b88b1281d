"""MoeConfig: the shape and routing rules of a mixture-of-experts feed-forward block (Qwen3-MoE, Mixtral),
read from a Hugging Face `config.json` or a GGUF file's metadata.

Torch-free, as model/config.py is, so that a server sizes a model before loading it; ModelConfig holds one as
its `moe` field (None for a dense model).

The families differ in four ways the block must reproduce:
- where the expert count lives: Qwen3-MoE hub configs say `num_experts`, but transformers 5 writes it as
  `num_local_experts` (its attribute_map), Mixtral's name;
- the expert width: Qwen3-MoE's `moe_intermediate_size` (its `intermediate_size` is the dense layers'),
  Mixtral's `intermediate_size`; GGUF's `{arch}.expert_feed_forward_length` and `feed_forward_length`;
- renormalising the top-k weights: Qwen3-MoE only with `norm_topk_prob` (transformers' default False, every
  released checkpoint true); Mixtral always; llama.cpp always, for both (so GGUF files imply true);
- the dtype the expert outputs are scaled in: Qwen3-MoE casts the weights to the model dtype first, Mixtral
  keeps them float32 (the product is float32, then cast); the same numbers in float32.
Qwen3-MoE may also keep some layers dense (`mlp_only_layers`, `decoder_sparse_step`); `is_sparse` says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import UnsupportedModelError

MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")
# mixture-of-experts families refused by name, and what they have that the runtime does not run
UNSUPPORTED_MOE = {
    "qwen2_moe": "Qwen2-MoE: a shared expert with its own sigmoid gate beside the routed ones",
    "deepseek_v2": "DeepSeek-V2: shared experts, grouped routing and latent attention",
    "deepseek_v3": "DeepSeek-V3: shared experts, sigmoid routing with a bias and latent attention",
    "gpt_oss": "gpt-oss: experts with biases and a clamped SwiGLU, attention sinks",
    "olmoe": "OLMoE: QK norms over the whole projection",
    "phimoe": "Phi-3.5-MoE: sparsemixer routing",
}


@dataclass(frozen=True)
class MoeConfig:
    hidden_size: int
    num_experts: int
    num_experts_per_tok: int  # top-k: the experts each token runs
    expert_intermediate_size: int  # one expert's SwiGLU width
    norm_topk_prob: bool  # the top-k weights are divided by their sum
    float32_scaling: bool = False  # Mixtral: expert outputs are scaled by float32 weights, then cast
    decoder_sparse_step: int = 1  # Qwen3-MoE: every step-th layer is sparse ...
    mlp_only_layers: tuple[int, ...] = ()  # ... except these, which keep a dense MLP

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_experts", "num_experts_per_tok", "expert_intermediate_size",
                     "decoder_sparse_step"):
            if getattr(self, name) < 1:
                raise UnsupportedModelError(f"config {name} must be >= 1, got {getattr(self, name)}")
        if self.num_experts_per_tok > self.num_experts:
            raise UnsupportedModelError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be at most the number of experts "
                f"({self.num_experts}): lower num_experts_per_tok"
            )

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` (from 0) holds experts rather than a dense MLP (transformers' rule)."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> MoeConfig:
        """Reads a Qwen3-MoE or Mixtral `config.json` dict; raises UnsupportedModelError saying what to change."""
        model_type = hf.get("model_type")
        if model_type not in MOE_MODEL_TYPES:
            raise UnsupportedModelError(f"model_type {model_type!r} has no mixture-of-experts layers Flotilla runs: "
                                        f"choose a {' or '.join(MOE_MODEL_TYPES)} model")
        num_experts = hf.get("num_experts", hf.get("num_local_experts"))
        if num_experts is None:
            raise UnsupportedModelError(f"a {model_type} config.json needs num_experts or num_local_experts")
        if model_type == "mixtral":
            return cls(hidden_size=int(hf["hidden_size"]), num_experts=int(num_experts),
                       num_experts_per_tok=int(hf.get("num_experts_per_tok", 2)),
                       expert_intermediate_size=int(hf["intermediate_size"]), norm_topk_prob=True,
                       float32_scaling=True)
        return cls(hidden_size=int(hf["hidden_size"]), num_experts=int(num_experts),
                   num_experts_per_tok=int(hf.get("num_experts_per_tok", 8)),
                   expert_intermediate_size=int(hf["moe_intermediate_size"]),
                   norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                   decoder_sparse_step=int(hf.get("decoder_sparse_step", 1)),
                   mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()))

    @classmethod
    def from_gguf(cls, architecture: str, fields: Mapping[str, Any]) -> MoeConfig | None:
        """From a GGUF file's metadata (`fields`: key -> value): `qwen3moe`, or `llama` with experts (Mixtral as
        llama.cpp converts it). None for a file without experts. llama.cpp renormalises the top-k weights of
        both, whatever the source config said, unless the file's `expert_weights_norm` says otherwise."""
        def field(key: str) -> Any:
            return fields.get(f"{architecture}.{key}")

        count = field("expert_count")
        if architecture not in ("qwen3moe", "llama") or not count:
            return None
        width = field("expert_feed_forward_length")
        if width is None and architecture == "llama":  # Mixtral: its experts are the dense width
            width = field("feed_forward_length")
        used = field("expert_used_count")
        if width is None or used is None:
            lacks = "expert_used_count" if width is not None else "expert_feed_forward_length"
            raise UnsupportedModelError(f"the GGUF file has {count} experts but no {architecture}.{lacks}: the file "
                                        "is incomplete; convert it again with a current llama.cpp")
        from gguf import ExpertGatingFuncType  # here: the module stays importable without gguf and numpy

        gating = field("expert_gating_func")
        if gating not in (None, ExpertGatingFuncType.SOFTMAX):
            raise UnsupportedModelError(f"{architecture}.expert_gating_func is {gating}: Flotilla routes experts by "
                                        f"softmax only ({int(ExpertGatingFuncType.SOFTMAX)})")
        norm = field("expert_weights_norm")
        return cls(hidden_size=int(field("embedding_length")), num_experts=int(count), num_experts_per_tok=int(used),
                   expert_intermediate_size=int(width), norm_topk_prob=True if norm is None else bool(norm),
                   float32_scaling=architecture == "llama")
