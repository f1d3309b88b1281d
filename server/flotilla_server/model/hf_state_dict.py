"""load_hf_state_dict: Hugging Face-named weights into a DecoderModel's layout, whatever their source.

A checkpoint names Q, K and V (and gate and up) apart, where the runtime holds each group as one fused matmul
(model/llama.py); a mixture of experts names each expert's matrices, where the runtime stacks them
(model/moe_weights.py). Every loader (a directory's safetensors, a GGUF dequantized and renamed) hands its
tensors here one at a time, so a weight is copied into place once and the parts of a fused one wait only for
their siblings.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .moe_weights import MoeLayerWeights


def load_hf_state_dict(model: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copies Hugging Face-named weights (`model.layers.0.self_attn.q_proj.weight`, ...) into the
    fused layout, and routers' and experts' into the stacked one (model/moe_weights.py). Raises ValueError
    naming any weight that is missing or unexpected."""
    params = dict(model.named_parameters())
    pending: dict[str, dict[str, torch.Tensor]] = {}  # fused name -> parts by HF name
    filled: set[str] = set()
    experts = MoeLayerWeights(model.layers)
    for hf_name, tensor in tensors:
        name = hf_name.removeprefix("model.")
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: the embedding is the head
        if experts.take(name, tensor):
            continue
        fused, part = _fused_target(name)
        if fused is None:
            if name not in params:
                raise ValueError(f"unexpected weight {hf_name!r}: the checkpoint does not match config.json")
            _copy(params[name], tensor, hf_name)
            filled.add(name)
            continue
        if fused not in params:
            raise ValueError(f"unexpected weight {hf_name!r}: the checkpoint does not match config.json")
        pending.setdefault(fused, {})[part] = tensor
        parts = _FUSED_PARTS[fused.rsplit(".", 2)[-2]]
        if all(p in pending[fused] for p in parts):
            done = pending.pop(fused)
            _copy(params[fused], torch.cat([done[p] for p in parts]), fused)
            filled.add(fused)
    experts.check_complete()
    missing = sorted(set(params) - filled - experts.filled())
    if missing:
        raise ValueError(f"checkpoint is missing weights {missing[:5]}{'...' if len(missing) > 5 else ''}")


_FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_PART_TO_FUSED = {p: f for f, parts in _FUSED_PARTS.items() for p in parts}


def _fused_target(name: str) -> tuple[str | None, str]:
    """`layers.0.self_attn.k_proj.bias` -> (`layers.0.self_attn.qkv_proj.bias`, `k_proj`)."""
    pieces = name.split(".")
    if len(pieces) >= 2 and pieces[-2] in _PART_TO_FUSED:
        part = pieces[-2]
        return ".".join([*pieces[:-2], _PART_TO_FUSED[part], pieces[-1]]), part
    return None, ""


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(
            f"weight {name!r} has shape {tuple(tensor.shape)}, config.json implies {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.copy_(tensor)
