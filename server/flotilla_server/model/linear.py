"""Linear layers that run float32 and bfloat16 CPU matmuls through oneDNN on a pre-packed weight, and
float32 single rows through a native kernel.

On CPU, `F.linear` calls MKL's sgemm, which on AMD processors takes a generic code path: measured on
the 2-core AMD EPYC (Zen 5) development machine, one thread, a [64, 256] x [256, 1376] matmul took
444 us through MKL and 196 us through oneDNN with the weight packed once into oneDNN's blocked layout
(2.3x, the same from 3 to 2048 rows; the matmuls are ~55 % of a tiny decode step at batch 64).
The results differ from MKL's by float32 rounding only (~1e-6 relative).

bfloat16 goes to oneDNN inside `F.linear` too, but on the plain weight, which oneDNN then reorders on
every call. Packed once, it ran faster at every row count: on the 2-core AMD EPYC (Zen 4, AVX512-BF16)
development machine, llama-100m's 64 matrices took 15.2 against 22.5 ms at one row and 26.6 against
42.7 ms at 16 rows (one thread), so a bfloat16 decode step reads its half-size weights at about the
rate float32 reads its own (26.6 ms at one row, column-major).

Rules:
- a float32 CPU input of one row with grad disabled runs the native kernel (model/native_gemv.py,
  model/kernels/gemv.cpp) on the row-major weight when `make setup` built it: a streaming dot product per
  output, the same bits on any thread count, 1.3x MKL's one-row kernel on one thread and 1.5x the packed
  path on two on the development machine (llama-100m's 64 matrices: 19-20 against 25-27 ms, 12-15
  against 20-23 ms);
- the packed path is taken only for CPU inputs with grad disabled (the oneDNN op has no autograd):
  float32 of at least `MIN_PACKED_ROWS` rows (one row too after `pack_one_row`, below), and
  bfloat16 of any row count where oneDNN has bfloat16 kernels for this CPU; everything else (float16
  among it) is plain `F.linear`;
- a packed weight is keyed by the weight's storage, version counter, dtype and device, so a weight that is
  copied into, moved or cast is packed again on its next use;
- the packed copy doubles the memory of the packed weights (fine for the CPU models this path serves).

One row (a decode step at batch 1) reads every weight once per token, so its speed is the weight's
memory-read rate. Without the native kernel, a float32 `Linear` on CPU keeps its weight column-major (the
same [out, in] parameter, stored as the transpose of an [in, out] matrix): `F.linear` then runs MKL's
non-transposed matrix-vector kernel, which streams the weight row by row into an accumulator that stays
in L1. On the development
machine, over llama-100m's 64 matrices (403 MB), that took 1.1-1.3x less time than the row-major layout,
and on one thread it is a little faster than the packed path (26 against 30 us for one matrix). But on
the AMD EPYC (Zen 4) development machine MKL's one-row kernel ran on one thread whatever the count
(llama-100m's 64 matrices: 22.1 ms on one thread, 22.4 on two) while the packed path splits (26.9 and
17.9 ms). So a runner whose one-row steps may borrow the HTTP core (engine/step_threads.py) packs one
row too, on whatever thread count each step runs: both kernels give the same bits on one thread and on
two, but not each other's, so a step's results must not depend on the count the measurement chose.
With the native kernel, and for every other dtype and device, weights stay row-major (bfloat16 on CPU
ran 12x slower column-major).
The layout follows the weight through `Module.to`, `to_empty` and `.float()` (`Linear._apply`), so
every loader gets it; the packed path packs from either layout to the same bytes, and the state dict,
loaders and `transformers` conversion see the same values (`copy_` writes into the layout).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .native_gemv import gemv_one_row

MIN_PACKED_ROWS = 2
# float32 CPU weights are column-major for MKL's one-row kernel; the native kernel reads them row-major
COLUMN_MAJOR_FLOAT32 = gemv_one_row is None


def _onednn_available() -> bool:
    ops = torch.ops.mkldnn
    try:
        return torch.backends.mkldnn.is_available() and bool(ops._reorder_linear_weight) and bool(ops._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


ONEDNN = _onednn_available()


def _onednn_bfloat16_available() -> bool:
    try:
        return ONEDNN and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


ONEDNN_BFLOAT16 = _onednn_bfloat16_available()


class PackedWeight:
    """One weight's oneDNN-packed copy, repacked when the weight changes; `min_rows`: the fewest float32
    rows that take it (`pack_one_row` lowers it to 1)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._packed: torch.Tensor | None = None
        self.min_rows = MIN_PACKED_ROWS

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

    def forget(self) -> None:
        """Drop the packed copy (a parked model holds no anonymous copy); the next use packs it again."""
        self._key, self._packed = None, None


def uses_packed_path(x: torch.Tensor, weight: torch.Tensor, min_rows: int = MIN_PACKED_ROWS) -> bool:
    if x.dtype != weight.dtype or x.device.type != "cpu" or weight.device.type != "cpu" or x.dim() != 2:
        return False
    if torch.is_grad_enabled():
        return False
    if x.dtype == torch.float32:
        return ONEDNN and x.shape[0] >= min_rows
    return x.dtype == torch.bfloat16 and ONEDNN_BFLOAT16


def packs(weight: torch.Tensor) -> bool:
    """Whether the rules above give `weight` a packed copy once a step of several rows has run."""
    if weight.device.type != "cpu":
        return False
    return (weight.dtype == torch.float32 and ONEDNN) or (weight.dtype == torch.bfloat16 and ONEDNN_BFLOAT16)


def pack_one_row(module: nn.Module) -> None:
    """Every packed weight under `module` takes float32 single rows too: for a runner whose one-row steps
    may run on more than one thread (see the rules)."""
    for m in module.modules():
        for value in vars(m).values():
            if isinstance(value, PackedWeight):
                value.min_rows = 1


def uses_native_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        gemv_one_row is not None
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dim() == 2
        and x.shape[0] == 1
        and weight.is_contiguous()
        and not torch.is_grad_enabled()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: PackedWeight) -> torch.Tensor:
    """`F.linear(x, weight, bias)`: through the native kernel or `packed` where the rules allow."""
    if uses_native_gemv(x, weight):
        y = gemv_one_row(x, weight)
        return y if bias is None else y.add_(bias)
    if not uses_packed_path(x, weight, packed.min_rows):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed.get(weight), bias, "none", [], "")


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """The same [out, in] values stored column-major: contiguous as [in, out], seen through `.t()`.
    `Tensor.to`, `empty_like` (hence `Module.to_empty`) and `copy_` keep the layout."""
    return weight.t().contiguous().t()


def is_column_major(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.t().is_contiguous()


def wants_column_major(weight: torch.Tensor) -> bool:
    """float32 on CPU (or on meta, before `to_empty` places it) without the native kernel: the layout of
    MKL's fast one-row kernel."""
    return COLUMN_MAJOR_FLOAT32 and weight.dtype == torch.float32 and weight.device.type in ("cpu", "meta")


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
