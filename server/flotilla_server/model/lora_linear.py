"""LoRA adapters in mixed batches: one forward pass for a step whose rows belong to different adapters and to
the base model, each projection adding its rows' adapters' products to the base's.

How: `LoraSlots` holds `max_loras` slots of factors for every target module, zero-padded to `max_rank`, in the
compute dtype, allocated once (what `--max-loras` costs is known at start): per projection, A [slots, parts x
rank, in] (Q, K and V's stacked) and B [slots, rank, out] (each part's rank rows under its own output columns).
An adapter is copied into a free slot (`load`) and out of it by zeroing (`clear`). Each of the model's four
projections is wrapped by a `LoraProjection` that, after the base product, adds the step's rows' adapter
products (`LoraSlots.set_rows` gives each row its slot). In float32 on CPU the native `lora_bgmv` op
(model/kernels/lora_bgmv.cpp) does it per row, reading that row's slot: x A_s^T, then each part's columns of
B_s; elsewhere (bfloat16, a GPU, no library), per slot present: its rows gathered, two products, scattered
back. So a step never makes a forward pass per adapter, and rows of the base model cost nothing. Padding is
exact: a slot's unused ranks hold zeros in A and B.
Measured on one thread of the 2-core Xeon VM (family 6 model 167), llama-100m's 48 projections, 8 slots of
rank 16, ms for all 48 per step, torch per slot / native: 1 row of one adapter 2.2 / 0.84; 16 rows of one
adapter 6.5 / 3.7; 16 rows over 8 adapters 26.6 / 13.6; 64 rows over 8 adapters 77 / 24; 512 rows 407 / 147.
At 16 rows over 8 adapters the native op reads each slot's 13 MB of factors once a step (the time is that
read: about 8 GB/s), which is the floor of float32 slots.

Rules:
- the products are peft's, unmerged: y = W x + B' (A x), B' = scaling * B (lora_adapter.py folds it);
- the base's own product is untouched, whatever holds its weights (float, GGUF blocks, int8), so adapters
  compose with every `--quantization`;
- a row's result does not depend on the other rows' adapters (each slot's rows are multiplied apart);
- slot -1 is the base model; `set_rows` takes one slot per row of the step (prefill tokens included).
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .lora_adapter import FUSED_TARGETS, TARGETS, LoraAdapter, part_sizes
from .native_gemv import native_op

_lora_bgmv = native_op("lora_bgmv")

BASE_SLOT = -1
# the runtime's projections and their parts (peft module names) in output order
PROJECTION_PARTS: dict[str, tuple[str, ...]] = {}
for _module, (_projection, _index) in TARGETS.items():
    PROJECTION_PARTS.setdefault(_projection, ())
    PROJECTION_PARTS[_projection] += (_module,)


class LoraSlots:
    """`max_loras` slots of adapter factors for every layer's projections, and the step's rows per slot."""

    def __init__(self, config: ModelConfig, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: str | torch.device = "cpu") -> None:
        self.max_loras, self.max_rank, self.dtype = max_loras, max_rank, dtype
        sizes = part_sizes(config)
        # (layer, projection) -> A [slots, parts * rank, in] and B [slots, rank, out]: part p's rank rows of A,
        # and its output columns of B (the projection's own order: Q, K, V; gate, up)
        self.a: dict[tuple[int, str], torch.Tensor] = {}
        self.b: dict[tuple[int, str], torch.Tensor] = {}
        self.part_ends: dict[str, torch.Tensor] = {}  # projection -> each part's last output column + 1
        for projection, parts in PROJECTION_PARTS.items():
            ends = torch.tensor([sizes[p][0] for p in parts], dtype=torch.long).cumsum(0)
            self.part_ends[projection] = ends
            for layer in range(config.num_layers):
                self.a[(layer, projection)] = torch.zeros(max_loras, len(parts) * max_rank, sizes[parts[0]][1],
                                                          dtype=dtype, device=device)
                self.b[(layer, projection)] = torch.zeros(max_loras, max_rank, int(ends[-1]), dtype=dtype,
                                                          device=device)
        self._rows: torch.Tensor | None = None  # the step's slot per row (native path)
        self._groups: list[tuple[int, torch.Tensor]] = []  # (slot, row indices) of this step, base rows left out
        self._native = _lora_bgmv is not None and dtype == torch.float32 and torch.device(device).type == "cpu"

    def nbytes(self) -> int:
        """What the slots hold, allocated at start: counted in the model's memory."""
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.b.values()))

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copies the adapter's factors into `slot` (cleared first); ranks over max_rank are the caller's to
        refuse (lora_adapter.load_adapter's cap)."""
        self.clear(slot)
        for (layer, module), factors in adapter.modules.items():
            if module in FUSED_TARGETS:  # one A for every part, each part its rows of B: B (A x), part by part
                projection = FUSED_TARGETS[module]
                for part in range(len(PROJECTION_PARTS[projection])):
                    self._load_part(slot, layer, projection, part, factors.a, factors.b, factors.rank)
                continue
            projection, part = TARGETS[module]
            self._load_part(slot, layer, projection, part, factors.a, factors.b, factors.rank, whole_b=True)

    def _load_part(self, slot: int, layer: int, projection: str, part: int, a: torch.Tensor, b: torch.Tensor,
                   rank: int, whole_b: bool = False) -> None:
        """Part `part`'s A rows and B columns of the slot: `b` is that part's [out, rank] (`whole_b`) or the
        fused projection's, whose rows of the part are taken."""
        ends = self.part_ends[projection]
        begin, end = (0 if part == 0 else int(ends[part - 1])), int(ends[part])
        self.a[(layer, projection)][slot, part * self.max_rank:part * self.max_rank + rank] = a.to(self.dtype)
        rows = b if whole_b else b[begin:end]
        self.b[(layer, projection)][slot, :rank, begin:end] = rows.t().to(self.dtype)

    def clear(self, slot: int) -> None:
        for t in (*self.a.values(), *self.b.values()):
            t[slot].zero_()

    def set_rows(self, slots: torch.Tensor | None) -> None:
        """The step's slot per row ([T] int64; BASE_SLOT for the base model); None: every row is the base's."""
        self._rows, self._groups = None, []
        if slots is None:
            return
        if self._native:
            self._rows = slots.contiguous()
            return
        for slot in sorted(set(slots.tolist()) - {BASE_SLOT}):
            self._groups.append((slot, (slots == slot).nonzero().flatten()))

    def add(self, layer: int, projection: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] plus each row's adapter product for x [T, in]; y unchanged where no row has one."""
        a, b = self.a[(layer, projection)], self.b[(layer, projection)]
        if self._rows is not None and x.dtype == torch.float32 and y.dtype == torch.float32:
            y = y.contiguous()
            _lora_bgmv(x.contiguous(), self._rows, a, b, self.part_ends[projection], y)
            return y
        rows_of = self._groups if self._rows is None else [
            (slot, (self._rows == slot).nonzero().flatten()) for slot in sorted(set(self._rows.tolist()) - {BASE_SLOT})]
        rank, ends = self.max_rank, self.part_ends[projection].tolist()
        for slot, rows in rows_of:
            xa = x.index_select(0, rows).to(self.dtype) @ a[slot].t()  # [n, parts * rank]
            deltas, begin = [], 0
            for i, end in enumerate(ends):
                deltas.append(xa[:, i * rank:(i + 1) * rank] @ b[slot, :, begin:end])
                begin = end
            delta = deltas[0] if len(deltas) == 1 else torch.cat(deltas, dim=1)
            y = y.index_add(0, rows, delta.to(y.dtype))
        return y


class LoraProjection(nn.Module):
    """A projection of layer `layer` whose output gains the step's adapters' products (LoraSlots.add)."""

    def __init__(self, base: nn.Module, slots: LoraSlots, layer: int, projection: str) -> None:
        super().__init__()
        self.base = base
        self.layer, self.projection = layer, projection
        self._slots = slots  # not a submodule: shared by every projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        flat_x, flat_y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        return self._slots.add(self.layer, self.projection, flat_x, flat_y).reshape(y.shape)


def install_lora(model: nn.Module, slots: LoraSlots) -> None:
    """Wraps every layer's four projections of a DecoderModel to read `slots` (two where the layer's MLP is a
    mixture of experts: lora_adapter.load_adapter refuses adapters of experts); the base weights stay as they
    are held. A model wrapped before (a LoadedModel reused, as tests do) is bound to these slots instead."""
    for layer_index, layer in enumerate(model.layers):
        for projection in PROJECTION_PARTS:
            if projection.startswith("mlp.") and model.config.is_sparse(layer_index):
                continue
            owner_name, attr = projection.split(".")
            owner = getattr(layer, owner_name)
            current = getattr(owner, attr)
            if isinstance(current, LoraProjection):
                current._slots = slots
            else:
                setattr(owner, attr, LoraProjection(current, slots, layer_index, projection))
