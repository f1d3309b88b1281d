"""LoRA adapters in mixed batches: one forward pass for a step whose rows belong to different adapters and to
the base model, each projection adding its rows' adapters' products to the base's.

How: `LoraSlots` holds `max_loras` slots of factors for every target module, zero-padded to `max_rank`, in the
compute dtype, allocated once (what `--max-loras` costs is known at start). An adapter is copied into a free
slot (`load`) and out of it by zeroing (`clear`). Each of the model's four projections is wrapped by a
`LoraProjection` that, after the base product, takes the step's rows per slot (`LoraSlots.set_rows`): for each
slot present, the rows' x times the stacked A of that projection's parts ([parts x max_rank, in]: one
product for Q, K and V together), then each part's B into its columns of y (`index_add_`). So a step makes
per projection one product pair per adapter present, never a forward pass per adapter, and rows of the base
model cost nothing. Padding is exact: a slot's unused ranks hold zeros in A and B.

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
from .lora_adapter import TARGETS, LoraAdapter, part_sizes

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
        self.a: dict[tuple[int, str], torch.Tensor] = {}  # (layer, projection) -> [slots, parts * rank, in]
        self.b: dict[tuple[int, str], list[torch.Tensor]] = {}  # -> per part [slots, out, rank]
        for layer in range(config.num_layers):
            for projection, parts in PROJECTION_PARTS.items():
                in_size = sizes[parts[0]][1]
                self.a[(layer, projection)] = torch.zeros(max_loras, len(parts) * max_rank, in_size, dtype=dtype,
                                                          device=device)
                self.b[(layer, projection)] = [torch.zeros(max_loras, sizes[p][0], max_rank, dtype=dtype, device=device)
                                               for p in parts]
        self._groups: list[tuple[int, torch.Tensor]] = []  # (slot, row indices) of this step, base rows left out

    def nbytes(self) -> int:
        """What the slots hold, allocated at start: counted in the model's memory."""
        tensors = list(self.a.values()) + [b for parts in self.b.values() for b in parts]
        return sum(t.numel() * t.element_size() for t in tensors)

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copies the adapter's factors into `slot` (cleared first); ranks over max_rank are the caller's to
        refuse (lora_adapter.load_adapter's cap)."""
        self.clear(slot)
        for (layer, module), factors in adapter.modules.items():
            projection, part = TARGETS[module]
            rank = factors.rank
            a = self.a[(layer, projection)]
            a[slot, part * self.max_rank:part * self.max_rank + rank] = factors.a.to(self.dtype)
            self.b[(layer, projection)][part][slot, :, :rank] = factors.b.to(self.dtype)

    def clear(self, slot: int) -> None:
        for a in self.a.values():
            a[slot].zero_()
        for parts in self.b.values():
            for b in parts:
                b[slot].zero_()

    def set_rows(self, slots: torch.Tensor | None) -> None:
        """The step's slot per row ([T] int64; BASE_SLOT for the base model); None: every row is the base's."""
        self._groups = []
        if slots is None:
            return
        for slot in sorted(set(slots.tolist()) - {BASE_SLOT}):
            self._groups.append((slot, (slots == slot).nonzero().flatten()))

    def add(self, layer: int, projection: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] plus each row's adapter product for x [T, in]; y unchanged where no row has one."""
        if not self._groups:
            return y
        a, bs = self.a[(layer, projection)], self.b[(layer, projection)]
        rank = self.max_rank
        for slot, rows in self._groups:
            xa = x.index_select(0, rows).to(self.dtype) @ a[slot].t()  # [n, parts * rank]
            deltas = [xa[:, i * rank:(i + 1) * rank] @ b[slot].t() for i, b in enumerate(bs)]
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
    """Wraps every layer's four projections of a DecoderModel to read `slots`; the base weights stay as they
    are held. A model wrapped before (a LoadedModel reused, as tests do) is bound to these slots instead."""
    for layer_index, layer in enumerate(model.layers):
        for projection in PROJECTION_PARTS:
            owner_name, attr = projection.split(".")
            owner = getattr(layer, owner_name)
            current = getattr(owner, attr)
            if isinstance(current, LoraProjection):
                current._slots = slots
            else:
                setattr(owner, attr, LoraProjection(current, slots, layer_index, projection))
