"""Products with per-channel symmetric int8 weights, for `--quantization int8` (any model: a Hugging Face
directory, a GGUF or `tiny`, quantized at load).

Why: a decode step at batch 1 reads every weight once, so its speed is the bytes it reads, and a pool's memory
budget is the bytes each model holds; an int8 weight is 1 byte (plus 4 bytes of scale per output row), its
float32 copy 4 (and 4 more for the packed copy the float matmuls keep).

- `quantize_int8(weight)`: (w int8 [n, k], scales float32 [n]) with scale = max|row| / 127 and w = the row
  divided by its scale, rounded to nearest (ties to even), in -127..127; a row of zeros has scale 0 and
  values 0. Computed in float32 whatever the weight's dtype.
- `int8_matmul(x, w, scales)`: x @ (w * scales[:, None]).T in float32. Under MANY_ROWS rows of x the native
  kernel (model/kernels/quant_matmul.cpp, `int8_matmul`) converts each weight row's integers to float in
  registers, multiplies them with x by FMA and scales the row's sum once: exact up to float rounding, the
  same bits on any thread count. From MANY_ROWS rows, as for GGUF blocks (model/quant_blocks.py says why),
  the native `dequantize_int8` decodes TILE_BYTES of float32 weights at a time into one buffer and torch.mm
  multiplies each tile. Without the library (or with x not float32 on CPU), a torch fallback decodes about
  1 MiB of weights at a time and multiplies each tile with torch.mm (quant_blocks.linear_by_tiles).
- `dequantize_int8_rows(w, scales, dtype)`: w * scales[:, None] (an embedding lookup decodes only its rows).

Rule: the kernels take k (a layer's in_features) a multiple of INT8_K_MULTIPLE (16: a row is whole vectors
of 16 weights, AVX-512's width, on every path); source.check_int8 refuses a model with another layer width
before loading it.
"""

from __future__ import annotations

import torch

from .config import INT8_K_MULTIPLE
from .native_gemv import native_op
from .quant_blocks import FALLBACK_TILE_BYTES, MANY_ROWS, TILE_BYTES, linear_by_tiles

__all__ = ["INT8_K_MULTIPLE", "dequantize_int8_rows", "int8_matmul", "quantize_int8"]

_int8_matmul = native_op("int8_matmul")
_dequantize_int8 = native_op("dequantize_int8")


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [n, k] (any float dtype, any layout) -> (int8 [n, k] contiguous, float32 scales [n]) on its device."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1) / 127
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))  # a row of zeros: 0 / 1
    q = torch.round(w / divisor[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    return q, scales.contiguous()


def dequantize_int8_rows(w: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w [rows, k] int8 and their scales [rows] -> [rows, k] in `dtype` (computed in float32)."""
    return (w.float() * scales[:, None]).to(dtype)


def int8_matmul(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [..., k] float32 @ (w [n, k] int8 * scales [n][:, None]).T -> [..., n] float32, no autograd."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    native = _int8_matmul is not None and x.dtype == torch.float32 and x.is_cpu and w.is_cpu
    if native and (rows < MANY_ROWS or _dequantize_int8 is None):
        if x.dim() == 2:
            return _int8_matmul(x, w, scales)
        return _int8_matmul(x.reshape(-1, k), w, scales).reshape(*x.shape[:-1], w.shape[0])
    if w.dim() != 2 or w.shape[1] != k or scales.shape != (w.shape[0],):
        raise ValueError(f"int8 weights {tuple(w.shape)} with scales {tuple(scales.shape)} do not take k = {k}")
    if native:
        y = _linear_by_native_tiles(x.reshape(-1, k), w, scales)
    else:
        y = _linear_by_tiles(x.reshape(-1, k), w, scales)
    return y.reshape(*x.shape[:-1], w.shape[0])


def _linear_by_native_tiles(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return linear_by_tiles(x, w.shape[0], TILE_BYTES,
                           lambda start, end, out: _dequantize_int8(w[start:end], scales[start:end], out))


def _linear_by_tiles(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return linear_by_tiles(x, w.shape[0], FALLBACK_TILE_BYTES, lambda start, end, out: out.copy_(
        dequantize_int8_rows(w[start:end].to(x.device), scales[start:end].to(x.device), x.dtype)))
