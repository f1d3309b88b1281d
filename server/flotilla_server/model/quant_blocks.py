"""Products with weights kept in llama.cpp's GGUF blocks (Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, and the k-quants Q2_K,
Q3_K, Q4_K, Q5_K and Q6_K), as uint8 tensors [rows, bytes per row] of the file's bytes.

Native kernels multiply Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K (NATIVE_TYPES); Q2_K and Q3_K take the
torch fallback below at every row count (exact too, but it decodes a tile of float weights per product: a
one-row product took about 100 times a kernel's time per weight for Q5_0 and Q5_1 before they had kernels,
model/kernels/q5_matmul.cpp). Their layouts and torch decoders are in model/quant_decoders.py.

Why: a decode step at batch 1 reads every weight once, so its speed is the bytes it reads, and a pool's memory
budget is the bytes each model holds; a Q8_0 weight is 8.5 bits, Q6_K 6.5625, Q5_1 6, Q5_0 and Q5_K 5.5, Q4_1
5, Q4_0 and Q4_K 4.5, its float32 copy 32.

- `quant_matmul(x, blocks, qtype)`: x @ dequantize(blocks).T in float32, by the native kernel
  (model/kernels/quant_matmul.cpp) when the kernels are built, else by a torch fallback that decodes about
  1 MiB of weights at a time and multiplies each tile with torch.mm (the whole float matrix is never held).
  From MANY_ROWS rows of x (float activations) the many-row path runs instead: the native dequantizer
  decodes TILE_BYTES of float32 weights at a time into one reused buffer, and torch.mm (MKL's sgemm) writes
  each tile's products straight into its columns of y. Why: from a few dozen rows the products are bound by
  arithmetic, and MKL's sgemm does more of it per cycle than the kernel's FMA tiles of 4 rows; the weights
  still stay in their blocks (at most one tile is ever float). Measured on one core of the 2-core Xeon VM
  (family 6 model 167; ms per call, kernel / many-row / F.linear on float32 weights):
      rows                 16                 32                 64                512
      1536 x 576 Q4_1      0.44/0.53/0.35     0.92/0.72/0.53     1.83/1.07/0.81     16.0/6.2/5.4
      576 x 1536 Q4_1      0.38/0.55/0.39     0.75/0.76/0.53     1.43/1.09/0.85     17.2/6.2/5.4
      49152 x 576 Q8_0     15.8/16.6/26.3     31.0/22.5/28.8     64.5/35.0/35.9     582/261/241
  so MANY_ROWS = 32, where every shape measured is as fast or faster (1536 x 576 and the head already at 24
  rows, 576 x 1536 not before 32); Q4_K and Q6_K gain alike (1536 x 1024 at 32 / 64 rows: Q4_K 1.24 / 2.51 in
  the kernel, 1.09 / 1.67 this way; Q6_K 1.56 / 3.17 against 1.14 / 1.74; F.linear 0.90 / 1.44), and Q5_0 and
  Q5_1 (1536 x 576 at 32 / 64 rows: 0.95-0.99 / 2.0-2.1 in the kernel, 0.64 / 1.05 this way; Q4_1 0.63 / 1.05).
  TILE_BYTES = 1.5 MiB: a tile stays in the core's 2 MiB L2 beside x's panel; 0.5 and 1 MiB were 5-15 % slower at
  24-128 rows (more, narrower sgemm calls: 576 x 1536 gets 85 rows per tile at 0.5 MiB), 2 MiB as fast at 64
  rows and more but slower at 24-32. Rules: the many-row path's results are within float rounding of
  F.linear(x, dequantize(W)) like the kernel's, but not bit-equal to them, so a row's bits depend on whether
  its batch reaches MANY_ROWS; and MKL splits long rows (k >= 1536) over threads, so its bits may differ
  between thread counts (the kernel's do not). Without the native dequantizer (a library built before it) the
  kernel runs at every row count; int8 activations keep the kernel too (their rounding is the mode's point),
  but only for INT8_TYPES: the others have no int8 path.
  The native kernel decodes each block of weights to float32 in registers and multiplies x as it is (exact up
  to float rounding, like the fallback) by default on AVX-512; on AVX2, where that path is bound by its
  instructions rather than by reading the weights, it rounds x to int16 per block of 32 and takes integer
  dot products (within 1/65534 of each block's largest activation: 256 times closer than int8, and as fast
  as the memory allows; FLOTILLA_KERNEL_ACTIVATIONS=float|int16 picks either form anywhere, and above
  MANY_ROWS rows both take the many-row path). FLOTILLA_KERNEL_ACTIVATIONS=int8 (read at load) makes
  it round the activations to int8 per 32 and take integer dot products instead, as llama.cpp does: faster
  at batch 1 where the float path is bound by instructions (a Q8_0 head: about 1.6x), but SmolLM2-135M's
  Q4_1 file then agrees with its dequantized weights on the top-1 token at only 94-95 % of positions, where
  the project asks for 98 % (tests/server/model/test_quantized_accuracy.py). Q4_K and Q6_K have the float
  path only (model/kernels/kquant_matmul.cpp, with its timings), and Q5_K with them; Q5_0 and Q5_1 have the
  float and int16 paths (model/kernels/q5_matmul.cpp, with timings; int16 in Q4_0's and Q4_1's code): in
  int8 mode all of these take the float path (INT8_TYPES: those with an int8 one). A library built before
  their kernels refuses their type ids: they then take the torch fallback (logged once);
- `dequantize_rows(blocks, qtype)`: the rows in float, equal to `gguf.quants.dequantize`: an embedding
  lookup decodes only the rows it reads (the native `dequantize_blocks` op gives the same bits, faster);
- `active_isa()` / `force_isa(name)`: the native kernel's instruction set (FLOTILLA_KERNEL_ISA sets it at
  load), for comparisons; "torch" where the fallback runs;
- `activations_setting()` / `force_activations(name)`: the native kernel's activations setting, "auto" (the
  default), "float", "int8" or "int16" (FLOTILLA_KERNEL_ACTIVATIONS sets it at load), for tests and
  benchmarks; `active_activations()`: the form they take on the instruction set in use (auto: int16 on AVX2,
  float elsewhere); "torch" where the fallback runs.

Block layouts (llama.cpp's ggml-common.h; little-endian). A block is 32 consecutive weights of a row:
  Q8_0, 34 bytes: fp16 d, int8 q[32];          w = d * q
  Q4_0, 18 bytes: fp16 d, uint8 qs[16];        w = d * (nibble - 8)
  Q4_1, 20 bytes: fp16 d, fp16 m, uint8 qs[16]; w = d * nibble + m
  (weight i < 16 is the low nibble of qs[i], weight i + 16 its high nibble)
and a k-quant's super-block 256 (so a row of k-quants is a multiple of 256 weights; llama.cpp gives tensors
with other rows another type):
  Q4_K, 144 bytes: fp16 d, fp16 dmin, uint8 scales[12], uint8 qs[128]; 8 sub-blocks of 32 weights with a 6-bit
    scale sc and min m each, packed in scales[] (quant_decoders.q4k_scales_and_mins); weight 64 j + i (i < 32) is
    the low nibble of qs[32 j + i] in sub-block 2 j, weight 64 j + 32 + i its high nibble in sub-block 2 j + 1;
    w = (d * sc) * nibble - dmin * m
  Q6_K, 210 bytes: uint8 ql[128], uint8 qh[64], int8 scales[16], fp16 d; 16 sub-blocks of 16 weights; weight
    128 h + 32 s + i (h < 2, s < 4, i < 32) has its low 4 bits from ql[64 h + 32 (s % 2) + i] (the low nibble
    for s < 2, the high one after) and its high 2 from bits 2 s and 2 s + 1 of qh[32 h + i], q in 0..63;
    w = (d * scales[sub-block]) * (q - 32)
(Q5_0, Q5_1, Q2_K, Q3_K and Q5_K: model/quant_decoders.py.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from gguf import GGMLQuantizationType

from . import quant_decoders as decoders
from .native_gemv import native_op

T = GGMLQuantizationType
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 = T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K
BLOCK_BYTES = {Q8_0: 34, Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q2_K: 84, Q3_K: 110, Q4_K: 144, Q5_K: 176, Q6_K: 210}
# the k-quants: super-blocks of 256 weights
KQUANT_TYPES = frozenset({Q2_K, Q3_K, Q4_K, Q5_K, Q6_K})
# weights per block: 32, or a k-quant's super-block of 256
BLOCK_WEIGHTS = {t: 256 if t in KQUANT_TYPES else 32 for t in BLOCK_BYTES}
# the types the native library multiplies (when built from today's sources); the others take the torch fallback
NATIVE_TYPES = frozenset({Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K})
# the types whose native kernel has an int8-activation path; the others take float activations in int8 mode
INT8_TYPES = frozenset({Q8_0, Q4_0, Q4_1})
# raw [rows, blocks, block bytes] -> float32 weights, in gguf's order of operations (model/quant_decoders.py)
_DECODERS = {Q5_0: decoders.q5_0, Q5_1: decoders.q5_1, Q2_K: decoders.q2_k, Q3_K: decoders.q3_k,
             Q4_K: decoders.q4_k, Q5_K: decoders.q5_k, Q6_K: decoders.q6_k}
# float32 bytes of weights the fallback decodes at a time (its temporaries are a few times that)
FALLBACK_TILE_BYTES = 1 << 20
# from this many rows of x (float activations), quant_matmul decodes TILE_BYTES of float32 weights at a time
# natively and multiplies each tile by torch.mm (why these values: the module's docstring)
MANY_ROWS = 32
TILE_BYTES = 3 << 19

_quant_matmul = native_op("quant_matmul")
_dequantize_blocks = native_op("dequantize_blocks")
_kernel_isa = native_op("kernel_isa")
_kernel_activations = native_op("kernel_activations")

log = logging.getLogger(__name__)


def _library_multiplies(qtype: GGMLQuantizationType, names: str) -> bool:
    """Whether the library multiplies `qtype` (standing for `names`, the types whose kernels came with it): one
    built before its kernel refuses its type id."""
    if _quant_matmul is None:
        return False
    try:
        _quant_matmul(torch.zeros(0, BLOCK_WEIGHTS[qtype]), torch.zeros(0, BLOCK_BYTES[qtype], dtype=torch.uint8),
                      int(qtype))
        return True
    except RuntimeError:
        log.warning("the native CPU kernels have no %s products: built from older sources, make setup "
                    "rebuilds them; those types take the torch fallback", names)
        return False


_NATIVE_KQUANTS = _library_multiplies(Q4_K, "Q4_K and Q6_K")
_NATIVE_Q5K = _library_multiplies(Q5_K, "Q5_K")
_NATIVE_Q5 = _library_multiplies(Q5_0, "Q5_0 and Q5_1")


def _native_type(qtype: int) -> bool:
    """Whether the loaded library multiplies (and dequantizes) blocks of `qtype`."""
    if qtype in (Q4_K, Q6_K):
        return _NATIVE_KQUANTS
    if qtype in (Q5_0, Q5_1):
        return _NATIVE_Q5
    return _NATIVE_Q5K if qtype == Q5_K else qtype in NATIVE_TYPES


def few_rows_product(qtype: int) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None:
    """The native op that quant_matmul calls for under MANY_ROWS float32 CPU rows of x times CPU blocks of
    `qtype`, or None where it takes another path: a caller making many such products (a decode step's
    projections) may call it directly and skip quant_matmul's checks."""
    if _quant_matmul is None or not _native_type(int(qtype)):
        return None
    return _quant_matmul


def _block_shape(qtype: int) -> tuple[int, int]:
    """(weights, bytes) of one block of the type."""
    try:
        known = GGMLQuantizationType(qtype)
        return BLOCK_WEIGHTS[known], BLOCK_BYTES[known]
    except (KeyError, ValueError):
        names = ", ".join(f"{t.name} ({t.value})" for t in BLOCK_BYTES)
        raise ValueError(f"GGML type {qtype} has no block kernel here: only {names}") from None


def dequantize_rows(blocks: torch.Tensor, qtype: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 blocks [rows, bytes per row] -> [rows, weights per block * blocks per row] in `dtype`: computed in
    float32 in gguf's order of operations, so float32 results have gguf.quants.dequantize's bits."""
    _, block_bytes = _block_shape(qtype)
    rows, row_bytes = blocks.shape
    raw = blocks.reshape(rows, row_bytes // block_bytes, block_bytes)
    if qtype in _DECODERS:
        return _DECODERS[qtype](raw).reshape(rows, -1).to(dtype)
    d = decoders.halves(raw, 0)
    if qtype == Q8_0:
        w = raw[..., 2:].contiguous().view(torch.int8).float().mul_(d)
    else:
        quants = raw[..., 4:] if qtype == Q4_1 else raw[..., 2:]
        nibbles = torch.cat((quants & 0x0F, quants >> 4), dim=-1).float()
        w = nibbles.mul_(d).add_(decoders.halves(raw, 2)) if qtype == Q4_1 else nibbles.sub_(8).mul_(d)
    return w.reshape(rows, -1).to(dtype)


def quant_matmul(x: torch.Tensor, blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    """x [..., k] float32 @ dequantize(blocks [n, k / block weights * block bytes]).T -> [..., n], no autograd
    (block weights: 32, or 256 for the k-quants).

    Under MANY_ROWS rows of x, the native kernel multiplies x by the exact weights (or by x rounded per block
    of 32: to int16 by default on AVX2, to int8 in int8 mode for INT8_TYPES; the error bounds are in
    tests/server/model/test_quant_kernels.py) and checks its arguments itself, so that this wrapper adds
    little to its few us per call (a decode step makes hundreds). From MANY_ROWS rows (but for int8
    activations of INT8_TYPES), and in the fallback (no library, or x not float32 on CPU), tiles of weights
    are decoded to float and multiplied by torch's sgemm: the exact weights, in x's dtype."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    native = (_quant_matmul is not None and x.dtype == torch.float32 and x.is_cpu and blocks.is_cpu
              and _native_type(int(qtype)))
    int8_kernel = qtype in INT8_TYPES and active_activations() == "int8"  # keeps its rounding at every row count
    if native and (rows < MANY_ROWS or _dequantize_blocks is None or int8_kernel):
        if x.dim() == 2:
            return _quant_matmul(x, blocks, int(qtype))
        return _quant_matmul(x.reshape(-1, k), blocks, int(qtype)).reshape(*x.shape[:-1], blocks.shape[0])
    block_weights, block_bytes = _block_shape(qtype)
    if k % block_weights or blocks.dim() != 2 or blocks.shape[-1] != k // block_weights * block_bytes:
        raise ValueError(f"{GGMLQuantizationType(qtype).name} blocks of {blocks.shape[-1]} bytes per row do not "
                         f"hold k = {k} weights")
    if native:
        y = _linear_by_native_tiles(x.reshape(-1, k), blocks, int(qtype))
    else:
        y = _linear_by_tiles(x.reshape(-1, k), blocks, qtype)
    return y.reshape(*x.shape[:-1], blocks.shape[0])


def linear_by_tiles(x: torch.Tensor, n: int, tile_bytes: int,
                    decode: Callable[[int, int, torch.Tensor], None]) -> torch.Tensor:
    """x [m, k] @ W.T for W [n, k] that is never held whole: `decode(start, end, out)` writes its rows
    start:end into `out`, one reused buffer of about `tile_bytes` in x's dtype, and torch.mm writes each
    tile's products straight into its columns of y. The many-row path and the torch fallback of every
    quantized weight (GGUF blocks here, int8 rows in int8_weights.py)."""
    k = x.shape[1]
    tile_rows = max(1, tile_bytes // (4 * k))
    x = x.contiguous()
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    buffer = torch.empty(min(tile_rows, n), k, dtype=x.dtype, device=x.device)
    for start in range(0, n, tile_rows):
        end = min(n, start + tile_rows)
        weight = buffer[:end - start]
        decode(start, end, weight)
        torch.mm(x, weight.t(), out=y[:, start:end])
    return y


def _linear_by_native_tiles(x: torch.Tensor, blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    blocks = blocks.contiguous()
    return linear_by_tiles(x, blocks.shape[0], TILE_BYTES,
                           lambda start, end, out: _dequantize_blocks(blocks[start:end], qtype, out))


def _linear_by_tiles(x: torch.Tensor, blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    return linear_by_tiles(x, blocks.shape[0], FALLBACK_TILE_BYTES, lambda start, end, out: out.copy_(
        dequantize_rows(blocks[start:end].to(x.device), qtype, x.dtype)))


def active_isa() -> str:
    """The native kernel's instruction set (scalar, avx2, avx512, avx512_vnni), or "torch" (the fallback)."""
    return "torch" if _kernel_isa is None else _kernel_isa("")


def force_isa(name: str) -> str:
    """Sets the native kernel's instruction set, or the CPU's best below it; returns the one now active."""
    return "torch" if _kernel_isa is None else _kernel_isa(name)


def activations_setting() -> str:
    """The native kernel's activations setting: "auto" (the default: int16 where the products run on AVX2,
    float elsewhere), "float", "int8" or "int16"; "torch" where the fallback runs."""
    if _quant_matmul is None:
        return "torch"
    return "int8" if _kernel_activations is None else _kernel_activations("").split(":")[0]


def active_activations() -> str:
    """The form the native kernel's activations take now, on the instruction set in use: "float" (exact),
    "int16" or "int8" (rounded per 32); "torch" where the fallback runs, "int8" for a library built before the
    float path."""
    if _quant_matmul is None:
        return "torch"
    return "int8" if _kernel_activations is None else _kernel_activations("").split(":")[-1]


def force_activations(name: str) -> str:
    """Sets the native kernel's activations ("auto", "float", "int8" or "int16") for the whole process; returns
    the setting now (see activations_setting)."""
    if _quant_matmul is None or _kernel_activations is None:
        return activations_setting()
    return _kernel_activations(name).split(":")[0]
