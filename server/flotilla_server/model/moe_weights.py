"""Mixture-of-experts weight names (Hugging Face and GGUF) mapped onto SparseMoeBlock's stacked layout.

One block's weights reach a loader in three spellings:
- hub checkpoints, and what transformers 5.23's `save_pretrained` writes by default (its
  save_original_format=True reverts its load-time conversion): one matrix per expert. Qwen3-MoE:
  `mlp.gate.weight` [E, H] and `mlp.experts.{e}.{gate_proj,up_proj}.weight` [I, H], `...down_proj.weight`
  [H, I]; Mixtral: `block_sparse_moe.gate.weight` and `block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`
  (w1 gate, w3 up, w2 down);
- transformers 5's module state dict, and `save_pretrained(save_original_format=False)`: stacked
  `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows, then up) and `mlp.experts.down_proj` [E, H, I], with no
  `.weight`, and `mlp.gate.weight`; Mixtral's `block_sparse_moe.` is renamed `mlp.` there;
- GGUF (llama.cpp, qwen3moe and Mixtral's llama): `blk.N.ffn_gate_inp.weight` [E, H], `ffn_gate_exps` and
  `ffn_up_exps` [E, I, H], `ffn_down_exps` [E, H, I] (numpy order, GGUF's dimensions reversed), stacked as
  transformers' own GGUF reader stacks them (Qwen2MoeTensorProcessor: gate then up along dim 1). The GGUF
  loader hands them on as `mlp.experts.gate_proj`, `up_proj` and `down_proj`: stacked, one part each.

Each name maps to an ExpertTarget, a slice of one of the block's parameters, and each tensor is copied
straight into its slice as it comes: a per-expert checkpoint never holds a second, stacked copy, and a
loader may stream a model's tensors one at a time (`MoeLayerWeights` routes a whole model's). GGUF blocks
are dequantized to float here; `--quantization gguf` keeps them instead (gguf_loader.py, quant_experts.py),
and the parts held so count as filled.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn

from .gguf_file import TensorInfo
from .moe import Experts, SparseMoeBlock

PARTS = ("router", "gate_up", "gate", "up", "down")


@dataclass(frozen=True)
class ExpertTarget:
    """Where a tensor goes: `part` of expert `expert`, or of every expert (None; the router has none)."""

    part: str  # one of PARTS: gate_up is gate and up together
    expert: int | None = None

    def __post_init__(self) -> None:
        assert self.part in PARTS, self.part


_HF_NAME = re.compile(r"(?:(?:model\.)?layers\.(?P<layer>\d+)\.)?(?:mlp|block_sparse_moe)\.(?P<rest>.+)")
_HF_EXPERT = re.compile(r"experts\.(?P<expert>\d+)\.(?P<part>\w+)\.weight")
_HF_STACKED = {"gate.weight": "router", "experts.gate_up_proj": "gate_up", "experts.down_proj": "down",
               "experts.gate_proj": "gate", "experts.up_proj": "up"}  # the last two: the GGUF loader's
_HF_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
_GGUF_NAME = re.compile(r"blk\.(?P<layer>\d+)\.(?P<part>ffn_gate_inp|ffn_gate_exps|ffn_up_exps|ffn_down_exps)\.weight")
_GGUF_PARTS = {"ffn_gate_inp": "router", "ffn_gate_exps": "gate", "ffn_up_exps": "up", "ffn_down_exps": "down"}


def hf_moe_target(name: str) -> tuple[int | None, ExpertTarget] | None:
    """(layer, target) of a Hugging Face MoE weight name, in any of the spellings above; the layer is None
    for a name without `model.layers.N.`. None for a name that is not an expert or router weight (a dense
    MLP's `mlp.gate_proj.weight`, a shared expert's)."""
    m = _HF_NAME.fullmatch(name)
    if m is None:
        return None
    layer = None if m["layer"] is None else int(m["layer"])
    rest = m["rest"]
    if rest in _HF_STACKED:
        return layer, ExpertTarget(_HF_STACKED[rest])
    e = _HF_EXPERT.fullmatch(rest)
    if e is None or e["part"] not in _HF_PARTS:
        return None
    return layer, ExpertTarget(_HF_PARTS[e["part"]], int(e["expert"]))


def gguf_moe_target(name: str) -> tuple[int, ExpertTarget] | None:
    """(layer, target) of a GGUF router or stacked-expert tensor name; None for any other tensor."""
    m = _GGUF_NAME.fullmatch(name)
    return None if m is None else (int(m["layer"]), ExpertTarget(_GGUF_PARTS[m["part"]]))


class MoeWeightFiller:
    """Copies one block's weights in as they come (`copy`) and says which are still missing (`missing`)."""

    def __init__(self, block: SparseMoeBlock) -> None:
        self.block = block
        # a router or experts held as GGUF blocks (no float parameters) were filled when they were made
        self._router_filled = not isinstance(getattr(block.router, "weight", None), nn.Parameter)
        dense = isinstance(block.experts, Experts)
        self._filled = torch.full((block.config.num_experts, 3), not dense)  # columns: gate, up, down

    def _destination(self, target: ExpertTarget) -> tuple[torch.Tensor, slice]:
        """(the parameter's slice the target names, the columns of `_filled` it covers)."""
        block, inter = self.block, self.block.config.expert_intermediate_size
        experts = slice(None) if target.expert is None else target.expert
        if target.part == "router":
            return block.router.weight, slice(0, 0)
        if target.part == "down":
            return block.experts.down_proj[experts], slice(2, 3)
        rows, columns = {"gate_up": (slice(None), slice(0, 2)), "gate": (slice(0, inter), slice(0, 1)),
                         "up": (slice(inter, 2 * inter), slice(1, 2))}[target.part]
        return block.experts.gate_up_proj[experts, rows], columns

    def copy(self, target: ExpertTarget, tensor: torch.Tensor, name: str) -> None:
        """Copies `tensor` (any float dtype, any device) into the target's slice. Raises ValueError naming the
        weight when the expert does not exist or its shape is not what the config implies."""
        num_experts = self.block.config.num_experts
        if target.expert is not None and not 0 <= target.expert < num_experts:
            raise ValueError(f"weight {name!r} is for expert {target.expert}, but the config has {num_experts} "
                             "experts: the checkpoint does not match config.json")
        destination, columns = self._destination(target)
        if tuple(destination.shape) != tuple(tensor.shape):
            raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, the config implies "
                             f"{tuple(destination.shape)}")
        with torch.no_grad():
            destination.copy_(tensor)
        if target.part == "router":
            self._router_filled = True
        else:
            self._filled[slice(None) if target.expert is None else target.expert, columns] = True

    def missing(self) -> list[str]:
        """What no tensor has filled yet: `router`, or `expert 3 up`."""
        names = [] if self._router_filled else ["router"]
        for expert, part in (~self._filled).nonzero().tolist():
            names.append(f"expert {expert} {('gate', 'up', 'down')[part]}")
        return names

    def check_complete(self) -> None:
        missing = self.missing()
        if missing:
            raise ValueError(f"checkpoint is missing MoE weights: {', '.join(missing[:5])}"
                             f"{'...' if len(missing) > 5 else ''}")


class MoeLayerWeights:
    """A whole decoder's MoE weights as a state-dict loader meets them: `take` routes a Hugging Face name to its
    layer's block (True), or declines a name that is no router or expert weight (False); `check_complete`
    then says what is missing, and `filled` names the parameters filled (for the loader's own check)."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self._blocks = {i: layer.mlp for i, layer in enumerate(layers) if isinstance(layer.mlp, SparseMoeBlock)}
        self._fillers: dict[int, MoeWeightFiller] = {i: MoeWeightFiller(b) for i, b in self._blocks.items()}

    def take(self, name: str, tensor: torch.Tensor) -> bool:
        """`name` without the `model.` prefix (`layers.3.mlp.experts.7.up_proj.weight`). Raises ValueError for
        an expert or router weight of a layer that has none (a dense layer's, or past the last)."""
        found = hf_moe_target(name) if self._blocks else None
        if found is None:
            return False
        layer, target = found
        if layer not in self._fillers:
            raise ValueError(f"unexpected weight {name!r}: layer {layer} has no experts as config.json describes "
                             "the model (check mlp_only_layers and decoder_sparse_step)")
        self._fillers[layer].copy(target, tensor, name)
        return True

    def filled(self) -> set[str]:
        """The parameter names (as DecoderModel.named_parameters gives them) of every block, once complete."""
        return {f"layers.{i}.mlp.{name}" for i, block in self._blocks.items() for name, _ in block.named_parameters()}

    def check_complete(self) -> None:
        for layer, filler in self._fillers.items():
            missing = filler.missing()
            if missing:
                raise ValueError(f"checkpoint is missing MoE weights of layer {layer}: {', '.join(missing[:5])}"
                                 f"{'...' if len(missing) > 5 else ''}")


def load_hf_moe(block: SparseMoeBlock, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Fills one block from its Hugging Face-named weights (any spelling above, with or without `model.layers.
    N.`). Raises ValueError naming a weight that is not one of the block's, or one that is missing."""
    filler, layers = MoeWeightFiller(block), set()
    for name, tensor in tensors:
        found = hf_moe_target(name)
        if found is None:
            raise ValueError(f"unexpected weight {name!r}: not a router or expert weight of a Qwen3-MoE or Mixtral "
                             "block")
        layers.add(found[0])
        filler.copy(found[1], tensor, name)
    if len(layers) > 1:
        raise ValueError(f"weights of layers {sorted(layers, key=str)} given for one block: pass one layer's")
    filler.check_complete()


def load_gguf_moe(block: SparseMoeBlock, tensors: Iterable[TensorInfo]) -> None:
    """Fills one block from one layer's GGUF router and expert tensors, dequantized to float32 first.
    Raises ValueError naming a tensor that is not one of them, or one that is missing."""
    filler, layers = MoeWeightFiller(block), set()
    for info in tensors:
        found = gguf_moe_target(info.name)
        if found is None:
            raise ValueError(f"unexpected GGUF tensor {info.name!r}: not a router or expert tensor")
        layers.add(found[0])
        filler.copy(found[1], dequantized(info), info.name)
    if len(layers) > 1:
        raise ValueError(f"tensors of layers {sorted(layers)} given for one block: pass one layer's")
    filler.check_complete()


def dequantized(info: TensorInfo) -> torch.Tensor:
    """The tensor as float32 in numpy order (a 3-D expert tensor stays [E, rows, columns]), copied off the
    read-only file mapping."""
    values = dequantize(info.data, GGMLQuantizationType(info.type_id))
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(info.shape))
