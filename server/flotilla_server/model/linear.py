"""Linear layers that run float32 CPU matmuls through oneDNN on a pre-packed weight.

On CPU, `F.linear` calls MKL's sgemm, which on AMD processors takes a generic code path: measured on
the 2-core AMD EPYC (Zen 5) development machine, one thread, a [64, 256] x [256, 1376] matmul took
444 us through MKL and 196 us through oneDNN with the weight packed once into oneDNN's blocked layout
(2.3x, the same from 3 to 2048 rows; the matmuls are ~55 % of a tiny decode step at batch 64).
The results differ from MKL's by float32 rounding only (~1e-6 relative).

Rules:
- the packed path is taken only for float32 CPU inputs of at least `MIN_PACKED_ROWS` rows with grad
  disabled (the oneDNN op has no autograd); everything else is plain `F.linear` (one row: MKL is a little
  faster, 26 against 30 us; bfloat16 and float16 already go to oneDNN inside `F.linear`);
- a packed weight is keyed by the weight's storage, version counter, dtype and device, so a weight that is
  copied into, moved or cast is packed again on its next use;
- the packed copy doubles the memory of the packed weights (fine for the CPU models this path serves).

One row (a decode step at batch 1) reads every weight once per token, so its speed is the weight's
memory-read rate. A float32 `Linear` on CPU keeps its weight column-major (the same [out, in] parameter,
stored as the transpose of an [in, out] matrix): `F.linear` then runs MKL's non-transposed matrix-vector
kernel, which streams the weight row by row into an accumulator that stays in L1. On the development
machine, over llama-100m's 64 matrices (403 MB), that took 1.1-1.3x less time than the row-major layout.
Every other dtype and device keeps the row-major layout: bfloat16 on CPU ran 12x slower column-major.
The layout follows the weight through `Module.to`, `to_empty` and `.float()` (`Linear._apply`), so
every loader gets it; the packed path packs from either layout to the same bytes, and the state dict,
loaders and `transformers` conversion see the same values (`copy_` writes into the layout).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

MIN_PACKED_ROWS = 2


def _onednn_available() -> bool:
    ops = torch.ops.mkldnn
    try:
        return torch.backends.mkldnn.is_available() and bool(ops._reorder_linear_weight) and bool(ops._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


ONEDNN = _onednn_available()


class PackedWeight:
    """One weight's oneDNN-packed copy, repacked when the weight changes."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._packed: torch.Tensor | None = None

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        try:
            version = weight._version
        except RuntimeError:  # an inference-mode tensor has no version counter; it cannot be modified in place
            version = -1
        key = (weight.data_ptr(), version, weight.dtype, weight.device, tuple(weight.shape))
        if key != self._key or self._packed is None:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
            self._key = key
        return self._packed


def uses_packed_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        ONEDNN
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dim() == 2
        and x.shape[0] >= MIN_PACKED_ROWS
        and not torch.is_grad_enabled()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: PackedWeight) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through `packed` when `uses_packed_path` allows."""
    if not uses_packed_path(x, weight):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed.get(weight), bias, "none", [], "")


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """The same [out, in] values stored column-major: contiguous as [in, out], seen through `.t()`.
    `Tensor.to`, `empty_like` (hence `Module.to_empty`) and `copy_` keep the layout."""
    return weight.t().contiguous().t()


def is_column_major(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.t().is_contiguous()


def wants_column_major(weight: torch.Tensor) -> bool:
    """float32 on CPU (or on meta, before `to_empty` places it): the layout of the fast one-row kernel."""
    return weight.dtype == torch.float32 and weight.device.type in ("cpu", "meta")


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state dict) with the packed CPU path of `linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self._packed = PackedWeight()
        self._relayout()

    def _relayout(self) -> None:
        w = self.weight
        if w.dim() == 2 and wants_column_major(w) != is_column_major(w):
            with torch.no_grad():
                w.data = column_major(w.data) if wants_column_major(w) else w.data.contiguous()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Linear:
        # every cast and move (`to`, `to_empty`, `float`, `cuda`) comes through here: the layout follows it
        super()._apply(fn, recurse)
        self._relayout()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self._packed)
