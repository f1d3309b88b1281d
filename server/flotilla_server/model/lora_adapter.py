"""A PEFT LoRA adapter directory (`adapter_config.json` + `adapter_model.safetensors`) read and checked against
the base model it is served on, before any of it reaches the model.

Why one place: the server loads adapters at start (`--lora NAME=SOURCE`), from a list file and through
`POST /v1/load_lora_adapter`; all three must accept the same directories, refuse the same ones with the same
messages (a 400 naming the field at the API, exit 2 at start), and never leave half an adapter resident.

Rules (what is served, as peft computes it: y = W x + scaling * B (A x), unmerged):
- target modules: each layer's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj (any
  subset, any layers), or a checkpoint's fused qkv_proj and gate_up_proj (Phi-3: one A and one B over the
  whole projection; an adapter naming both a fused module and its parts in one layer is refused); the
  adapter's weights say which, and any other module is refused by name;
- rank at most MAX_LORA_RANK per module (`r`, or `rank_pattern`'s value for that module);
- scaling = lora_alpha / r, or lora_alpha / sqrt(r) with `use_rslora` (`alpha_pattern` per module too); it is
  folded into B once, at read, so the product is B' (A x);
- refused: `use_dora`, `modules_to_save`, the head or the embedding as targets (`lm_head`, `embed_tokens`),
  a trained `bias`, `fan_in_fan_out`, and weights whose shapes do not fit the base (another hidden size,
  more layers): each by a LoraAdapterError that names the adapter and what to change.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig

MAX_LORA_RANK = 64
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# peft's module names -> (the runtime's fused projection, which part of it, in output order)
TARGETS = {"q_proj": ("self_attn.qkv_proj", 0), "k_proj": ("self_attn.qkv_proj", 1), "v_proj": ("self_attn.qkv_proj", 2),
           "o_proj": ("self_attn.o_proj", 0), "gate_proj": ("mlp.gate_up_proj", 0), "up_proj": ("mlp.gate_up_proj", 1),
           "down_proj": ("mlp.down_proj", 0)}
# peft's names for a projection a checkpoint holds fused (Phi-3's qkv_proj and gate_up_proj) -> the runtime's
# projection: one A and one B over all of its output columns
FUSED_TARGETS = {"qkv_proj": "self_attn.qkv_proj", "gate_up_proj": "mlp.gate_up_proj"}
SERVED_MODULES = (*TARGETS, *FUSED_TARGETS)
_KEY = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight")


class LoraAdapterError(ValueError):
    """An adapter that cannot be served on this base; the message names the adapter and what to change."""


@dataclass(frozen=True)
class LoraModule:
    """One target module's factors: a [rank, in] and b [out, rank], float32, b already times the scaling."""

    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    source: str
    modules: dict[tuple[int, str], LoraModule]  # (layer, peft module name: "q_proj", ..., or "qkv_proj", ...)

    @property
    def max_rank(self) -> int:
        return max(m.rank for m in self.modules.values())

    def nbytes(self, dtype_bytes: int) -> int:
        """Its factors' bytes in a dtype of `dtype_bytes` per element: what holding it resident costs."""
        return dtype_bytes * sum(m.a.numel() + m.b.numel() for m in self.modules.values())


def part_sizes(c: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each target module of the base (the parts: a slot holds each part's factors)."""
    q, kv, h, i = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}


def module_sizes(c: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of every module an adapter may name: the parts, and the fused projections (their parts' rows)."""
    sizes = part_sizes(c)
    fused = {name: (sum(sizes[m][0] for m, (p, _) in TARGETS.items() if p == projection), c.hidden_size)
             for name, projection in FUSED_TARGETS.items()}
    return {**sizes, **fused}


def read_adapter_config(name: str, path: Path) -> dict:
    """The adapter's adapter_config.json, after the checks that need no weights."""
    file = path / CONFIG_FILE
    if not file.is_file():
        raise LoraAdapterError(f"LoRA adapter {name!r}: {file} not found: a PEFT adapter directory holds "
                               f"{CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        config = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {file} is not readable JSON ({e})") from None
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise LoraAdapterError(f"LoRA adapter {name!r}: peft_type {config.get('peft_type')!r} is not LORA")
    refusals = [
        (config.get("use_dora"), "use_dora is true: DoRA adapters are not served; merge it or train a LoRA"),
        (config.get("modules_to_save"), f"modules_to_save {config.get('modules_to_save')} trains whole modules "
                                        "beside the adapter: not served"),
        (config.get("bias", "none") != "none", f"bias {config.get('bias')!r} trains biases: only bias 'none' is served"),
        (config.get("fan_in_fan_out"), "fan_in_fan_out is true (Conv1D bases): not served"),
    ]
    for refused, why in refusals:
        if refused:
            raise LoraAdapterError(f"LoRA adapter {name!r}: {why}")
    targets = config.get("target_modules") or []
    named = [targets] if isinstance(targets, str) else list(targets)
    for target in named:
        if any(word in target for word in ("lm_head", "embed_tokens")):
            raise LoraAdapterError(f"LoRA adapter {name!r}: target {target!r} adapts the head or the embedding: "
                                   f"only {', '.join(SERVED_MODULES)} are served")
    return config


def _module_value(config: dict, pattern_key: str, default_key: str, module: str, layer: int) -> float:
    """peft's per-module override (`rank_pattern`, `alpha_pattern`: keys matched against the module's name),
    else the adapter's value."""
    full = f"model.layers.{layer}.{module}"
    for pattern, value in (config.get(pattern_key) or {}).items():
        if re.search(rf"(^|\.){pattern}$", full) or pattern == module:
            return value
    return config[default_key]


def load_adapter(name: str, source: str, base: ModelConfig, max_rank: int = MAX_LORA_RANK) -> LoraAdapter:
    """The adapter at `source`, checked against `base` (LoraAdapterError, naming the adapter, otherwise)."""
    path = Path(source)
    config = read_adapter_config(name, path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise LoraAdapterError(f"LoRA adapter {name!r}: {weights} not found (adapter_model.bin is not read: save "
                               "the adapter with safe_serialization)")
    sizes = module_sizes(base)
    factors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(str(weights), framework="pt", device="cpu") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            match = _KEY.fullmatch(key)
            module = match.group(3) if match else None
            if match is None or module not in SERVED_MODULES:
                raise LoraAdapterError(f"LoRA adapter {name!r}: weight {key} targets a module that is not served: "
                                       f"only each layer's {', '.join(SERVED_MODULES)}")
            factors.setdefault((int(match.group(1)), module), {})[match.group(4)] = f.get_tensor(key).float()
    if not factors:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {weights} holds no LoRA weights")
    for layer, fused in {(layer, m) for layer, m in factors if m in FUSED_TARGETS}:
        parts = [m for m, (projection, _) in TARGETS.items() if projection == FUSED_TARGETS[fused]]
        if any((layer, part) in factors for part in parts):
            raise LoraAdapterError(f"LoRA adapter {name!r}: layer {layer} adapts {fused} and its parts "
                                   f"({', '.join(p for p in parts if (layer, p) in factors)}) both: train one or the other")
    modules = {}
    for (layer, module), ab in sorted(factors.items()):
        where = f"layer {layer} {module}"
        if layer >= base.num_layers:
            raise LoraAdapterError(f"LoRA adapter {name!r} adapts {where}, but the base has {base.num_layers} layers: "
                                   "it was trained for another base model")
        if base.is_sparse(layer) and TARGETS[module][0].startswith("mlp."):
            raise LoraAdapterError(f"LoRA adapter {name!r} adapts {where}, but that layer's MLP is a mixture of "
                                   "experts: adapters of experts are not served; train one for the attention only")
        if set(ab) != {"A", "B"}:
            raise LoraAdapterError(f"LoRA adapter {name!r}: {where} lacks its lora_{'B' if 'A' in ab else 'A'} weight")
        a, b = ab["A"], ab["B"]
        out_size, in_size = sizes[module]
        rank = a.shape[0]
        if a.shape[1] != in_size or b.shape != (out_size, rank):
            raise LoraAdapterError(
                f"LoRA adapter {name!r}: {where} has factors A {list(a.shape)} and B {list(b.shape)}, but the base's "
                f"{module} is [{out_size}, {in_size}] ([out, in]; hidden size {base.hidden_size}): it was trained "
                "for another base model")
        if rank > max_rank:
            raise LoraAdapterError(f"LoRA adapter {name!r}: rank {rank} at {where} is over the cap of {max_rank}")
        r = _module_value(config, "rank_pattern", "r", module, layer)
        alpha = _module_value(config, "alpha_pattern", "lora_alpha", module, layer)
        scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        modules[(layer, module)] = LoraModule(a.contiguous(), (b * scaling).contiguous())
    return LoraAdapter(name, source, modules)
