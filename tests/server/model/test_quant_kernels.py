"""Products with GGUF blocks (model/quant_blocks.py, model/kernels/quant_matmul.cpp) against F.linear on the
weights `gguf.quants.dequantize` gives, for Q8_0, Q4_0 and Q4_1 (the k-quants Q4_K and Q6_K, held to the same
float bound with this file's helpers: test_kquant_kernels.py).

The native kernel's default (float activations) decodes each weight block to exactly gguf's weights and
multiplies x as it is, so it differs from the reference by float rounding alone; per output element (x row,
weight row w):

    |y - ref| <= (k + 64) * 2**-22 * sum_j |x_j| |w_j|  +  2**-100

twice the worst case of a sum of k + 64 terms rounded to float32 (u = 2**-24): F.linear's k, the kernel's
lanes and their reduction (the last term: products that underflow). The torch fallback multiplies the exact
weights too: the same bound.

In int8 mode (FLOTILLA_KERNEL_ACTIVATIONS=int8, forced here through `force_activations` and restored after
each test) the kernel rounds each activation row to int8 per block of 32 (scale d = amax / 127, amax of the
block's |x|), so each x_j becomes x'_j with |x_j - x'_j| <= d / 2 = amax_b / 254, and then computes x' @ w.T
exactly up to float rounding. Its bound is the same for every type:

    |y - ref| <= sum_b amax_b / 254 * sum_{j in b} |w_j|                 (rounding the activations)
               + (k + 64) * 2**-22 * sum_b amax_b * sum_{j in b} W_j     (float32: the kernel's and F.linear's)
               + 2**-100                                               (scales that underflow: subnormal x)

with W_j = |w_j| for Q8_0 and Q4_0, and |d * nibble_j| + |m| for Q4_1 (whose kernel sums the d and m terms
apart; Q5_1's int16 path alike, test_q5_kernels.py).

In int16 mode (the default where the products run on AVX2: `auto`) the rounding is to int16 (d = amax / 32767):
the same bound with amax_b / 65534 in the first term, and the same agreement between the paths.

From quant_blocks.MANY_ROWS rows (float activations) quant_matmul decodes tiles of weights natively (their
bits: gguf's, tested per instruction set) and multiplies them by torch.mm: the same float bound, but MKL's
sgemm splits long rows (k >= 1536) over threads, so that path is held to the bound alone on each thread
count, not to equal bits.

Each instruction set this CPU has (forced through `force_isa`) is held to its bound and, under MANY_ROWS
rows, gives the same bits on one thread and two; in int8 mode each is also within the float term alone of the scalar path: all paths
round x alike and their integer products are exact, so an integer off by one shows there even where the
bound would hide it. A row's result does not depend on the other rows of x. The native tests skip when the
kernels are not built.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flotilla_server.model import quant_blocks
from flotilla_server.model.native_gemv import LIBRARY
from flotilla_server.model.quant_blocks import (
    BLOCK_BYTES,
    Q4_0,
    Q4_1,
    Q5_1,
    Q8_0,
    dequantize_rows,
    force_activations,
    force_isa,
    quant_matmul,
)
from flotilla_server.model.quant_linear import QuantizedLinear
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .kernel_isas import assert_dequantizer_bits, assert_rows_independent, available_isas

TYPES = [Q8_0, Q4_0, Q4_1]
MIN_TYPES = (Q4_1, Q5_1)  # w = d * q + m, m the fp16 at byte 2 (the rounded paths sum the two terms apart)
ROWS = [1, 2, 3, 4, 8, 16, 64]
SHAPES = [(n, k) for n in (1, 7, 33, 97) for k in (32, 96, 160, 608)]  # k: blocks, not SIMD widths
LONG_ROWS = [(9, 32 * 131)]  # the float path's SIMD code converts scales per 64 blocks: 64 + 64 + 3

native = pytest.mark.skipif(quant_blocks._quant_matmul is None,
                            reason="the native kernels are not built (make setup runs scripts/build_kernels.py)")



@contextlib.contextmanager
def activations_forced(name: str):
    """The native kernel in one activations mode, then in the one before (also when the body fails)."""
    before = quant_blocks.activations_setting()
    assert force_activations(name) == name
    try:
        yield
    finally:
        force_activations(before)


@pytest.fixture
def int8_activations():
    with activations_forced("int8"):
        yield


@pytest.fixture
def float_activations():
    with activations_forced("float"):
        yield



@functools.cache
def quantized(qtype: GGMLQuantizationType, n: int, k: int) -> np.ndarray:
    rng = np.random.default_rng([int(qtype), n, k])
    return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


def reference(x: torch.Tensor, blocks: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    return F.linear(x, torch.from_numpy(dequantize(blocks, qtype)))


def float_bound(x: torch.Tensor, blocks: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    """The float path's (and the fallback's) bound, [m, n] in float64."""
    w = torch.from_numpy(dequantize(blocks, qtype)).double().abs()
    return (x.shape[1] + 64) * 2**-22 * (x.double().abs() @ w.T) + 2**-100


def bounds(x: torch.Tensor, blocks: np.ndarray, qtype: GGMLQuantizationType,
           levels: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """The rounded activations' bound, two terms, rounding and float, each [m, n] in float64 (levels: 127 for
    int8, 32767 for int16)."""
    n, k = blocks.shape[0], x.shape[1]
    w = torch.from_numpy(dequantize(blocks, qtype)).double().abs()
    magnitude = w
    if qtype in MIN_TYPES:  # |d * q| + |m|: the blocks with m = 0 give d * q (exact)
        raw = blocks.copy().reshape(n, -1, BLOCK_BYTES[qtype])
        m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16).astype(np.float64))  # [n, blocks, 1]
        raw[..., 2:4] = 0
        scaled = torch.from_numpy(dequantize(raw.reshape(n, -1), qtype)).double().abs().reshape(n, -1, 32)
        magnitude = (scaled + m.abs()).reshape(n, k)
    amax = x.double().abs().reshape(x.shape[0], -1, 32).amax(-1)  # [m, blocks]
    rounding = amax @ w.reshape(n, -1, 32).sum(-1).T / (2 * levels)
    return rounding, (k + 64) * 2**-22 * (amax @ magnitude.reshape(n, -1, 32).sum(-1).T) + 2**-100


def assert_within_float_bound(y: torch.Tensor, x: torch.Tensor, blocks: np.ndarray, qtype: GGMLQuantizationType,
                              ref: torch.Tensor | None = None, bound: torch.Tensor | None = None) -> None:
    """The float path and the fallback: float rounding only (ref and bound: computed already)."""
    ref = reference(x, blocks, qtype) if ref is None else ref
    bound = float_bound(x, blocks, qtype) if bound is None else bound
    worst = ((y.double() - ref.double()).abs() - bound).max()
    assert worst <= 0, f"{qtype.name} {tuple(x.shape)} x {blocks.shape}: error exceeds the bound by {worst.item():.3g}"


LEVELS = {"int8": 127, "int16": 32767}


def assert_within_rounded_bound(y: torch.Tensor, x: torch.Tensor, blocks: np.ndarray,
                             qtype: GGMLQuantizationType, mode: str = "int8") -> None:
    """The rounded paths (int8, int16): both terms."""
    error = (y.double() - reference(x, blocks, qtype).double()).abs()
    rounding, floating = bounds(x, blocks, qtype, LEVELS[mode])
    worst = (error - (rounding + floating)).max()
    assert worst <= 0, f"{qtype.name} {tuple(x.shape)} x {blocks.shape}: error exceeds the bound by {worst.item():.3g}"


def assert_paths_agree(outs: dict[str, torch.Tensor], x: torch.Tensor, blocks: np.ndarray,
                       qtype: GGMLQuantizationType) -> None:
    """int8, int16: the paths round x alike and their integer products are exact: they differ by float rounding
    only."""
    _, floating = bounds(x, blocks, qtype)
    for isa, y in outs.items():
        worst = ((y.double() - outs["scalar"].double()).abs() - floating).max()
        assert worst <= 0, f"{isa} and scalar differ by {worst.item():.3g} more than float rounding"


def on(isa: str, function, *args):
    assert force_isa(isa) == isa
    return function(*args)



def on_one_and_two_threads(isa: str, x: torch.Tensor, blocks: torch.Tensor, qtype: GGMLQuantizationType):
    assert force_isa(isa) == isa
    outs = []
    for count in (1, 2):
        torch.set_num_threads(count)
        outs.append(quant_matmul(x, blocks, qtype))
    if x.shape[0] < quant_blocks.MANY_ROWS or quant_blocks.active_activations() == "int8":
        # the many-row path's torch.mm (MKL) splits k >= 1536 over threads: its bits may differ (bound only)
        assert torch.equal(outs[0], outs[1]), f"{isa}: bits differ between one thread and two"
    return outs[0]


# ---- float activations (the default)

@native
@pytest.mark.usefixtures("restore_isa")
def test_auto_is_the_default_int16_on_avx2_and_float_elsewhere() -> None:
    """AVX2's float path is bound by its decode instructions, AVX-512's by reading the weights (quant_matmul.cpp)."""
    if os.environ.get("FLOTILLA_KERNEL_ACTIVATIONS", "auto") != "auto":
        pytest.skip("FLOTILLA_KERNEL_ACTIVATIONS is set")
    assert quant_blocks.activations_setting() == "auto"
    for isa in available_isas():
        force_isa(isa)
        assert quant_blocks.active_activations() == ("int16" if isa == "avx2" else "float"), isa


@native
@pytest.mark.usefixtures("float_activations", "restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_float_path_within_the_float_bound_on_every_instruction_set(qtype: GGMLQuantizationType, rows: int) -> None:
    """No activation-rounding term: each path, on one thread and two (the same bits), is F.linear on the
    dequantized weights up to float rounding."""
    isas = available_isas()
    torch.manual_seed(rows)
    for n, k in SHAPES + LONG_ROWS:
        blocks = quantized(qtype, n, k)
        x = torch.randn(rows, k) * torch.logspace(-2, 1, k)  # blocks of different scales
        ref, bound = reference(x, blocks, qtype), float_bound(x, blocks, qtype)
        for isa in isas:
            y = on_one_and_two_threads(isa, x, torch.from_numpy(blocks), qtype)
            assert y.shape == (rows, n) and y.dtype == torch.float32
            assert_within_float_bound(y, x, blocks, qtype, ref, bound)


@native
@pytest.mark.usefixtures("restore_isa")
@pytest.mark.parametrize("activations", ["float", "int8", "int16"])
def test_a_rows_result_does_not_depend_on_the_other_rows(activations: str) -> None:
    """Rows go in tiles of up to 4; each row's sums are the same whatever tile it is in."""
    with activations_forced(activations):
        assert_rows_independent(TYPES, lambda qtype: torch.from_numpy(quantized(qtype, 33, 160)), 160)


@native
@pytest.mark.usefixtures("float_activations")
def test_float_path_takes_x_as_it_is() -> None:
    """No rounding of x: a NaN or infinity stays in its own row; a block of subnormals is multiplied as it is."""
    blocks = quantized(Q4_1, 7, 96)
    x = torch.randn(4, 96)
    x[0, 5], x[1, 40], x[2] = float("nan"), float("inf"), x[2] * 1e-40
    y = quant_matmul(x, torch.from_numpy(blocks), Q4_1)
    assert y[0].isnan().all() and not y[1].isfinite().any() and y[2:].isfinite().all()
    assert_within_float_bound(y[2:], x[2:], blocks, Q4_1)
    assert (y[2] != 0).all()


# ---- the many-row path (native dequantizer + torch.mm)

DEQUANTIZE_SHAPES = [(1, 32), (7, 96), (33, 160), (97, 608), (9, 32 * 131)]  # 97 x 608, 9 x 4192: in parallel


@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("random_bytes", [False, True], ids=["quantized", "random-bytes"])
def test_native_dequantizer_has_gguf_bits_on_every_instruction_set(qtype: GGMLQuantizationType,
                                                                    random_bytes: bool) -> None:
    """Every weight has gguf.quants.dequantize's bits, on each instruction set and thread count, for any bytes
    (random ones include infinite and NaN scales, and negative ones, whose Q4_0 zeros are -0)."""
    rng = np.random.default_rng(int(qtype))
    for n, k in DEQUANTIZE_SHAPES:
        if random_bytes:
            blocks = rng.integers(0, 256, (n, k // 32 * BLOCK_BYTES[qtype]), dtype=np.uint8)
        else:
            blocks = quantized(qtype, n, k)
        with np.errstate(all="ignore"):
            expected = dequantize(blocks, qtype).view(np.uint32)
        assert_dequantizer_bits(blocks, qtype, expected)


@native
def test_native_dequantizer_checks_its_inputs() -> None:
    op = torch.ops.flotilla.dequantize_blocks
    blocks = torch.zeros(3, 34, dtype=torch.uint8)
    cases = [((blocks, 8, torch.empty(3, 64)), "do not fill out"),
             ((blocks, 8, torch.empty(2, 32)), "do not fill out"),
             ((blocks, 1, torch.empty(3, 32)), "qtype 1 is none of"),
             ((blocks, 8, torch.empty(3, 32, dtype=torch.float64)), "out must be float32"),
             ((blocks.view(torch.int8), 8, torch.empty(3, 32)), "blocks must be uint8"),
             ((blocks, 8, torch.empty(3, 64)[:, ::2]), "must be contiguous")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            op(*args)


@native
@pytest.mark.usefixtures("float_activations", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_many_row_path_within_the_float_bound(monkeypatch: pytest.MonkeyPatch, qtype: GGMLQuantizationType) -> None:
    """From MANY_ROWS rows quant_matmul decodes tiles of weights (several here, the last one short) and takes
    torch.mm: F.linear on the dequantized weights up to float rounding, on one thread and two."""
    calls = []
    dequantize_blocks = quant_blocks._dequantize_blocks
    monkeypatch.setattr(quant_blocks, "_dequantize_blocks", lambda *args: calls.append(1) or dequantize_blocks(*args))
    monkeypatch.setattr(quant_blocks, "TILE_BYTES", 40 * 4 * 608)  # 40 rows of 608 weights
    many = quant_blocks.MANY_ROWS
    torch.manual_seed(int(qtype))
    for n, k in ((97, 608), (33, 160)):
        blocks = quantized(qtype, n, k)
        for rows in (many - 1, many, 64, 200):
            x = torch.randn(rows, k) * torch.logspace(-2, 1, k)
            calls.clear()
            for count in (1, 2):
                torch.set_num_threads(count)
                y = quant_matmul(x, torch.from_numpy(blocks), qtype)
                assert y.shape == (rows, n) and y.dtype == torch.float32 and y.is_contiguous()
                assert_within_float_bound(y, x, blocks, qtype)
            assert bool(calls) == (rows >= many), (rows, len(calls))


# ---- int8 activations (FLOTILLA_KERNEL_ACTIVATIONS=int8)

@native
@pytest.mark.usefixtures("int8_activations")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_int8_path_within_the_rounding_bound(qtype: GGMLQuantizationType, rows: int) -> None:
    torch.manual_seed(rows)
    for n, k in SHAPES:
        blocks = quantized(qtype, n, k)
        x = torch.randn(rows, k) * torch.logspace(-2, 1, k)  # blocks of different scales
        y = quant_matmul(x, torch.from_numpy(blocks), qtype)
        assert y.shape == (rows, n) and y.dtype == torch.float32
        assert_within_rounded_bound(y, x, blocks, qtype)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_torch_fallback_matches_f_linear(monkeypatch: pytest.MonkeyPatch, qtype: GGMLQuantizationType, rows: int) -> None:
    monkeypatch.setattr(quant_blocks, "_quant_matmul", None)
    monkeypatch.setattr(quant_blocks, "FALLBACK_TILE_BYTES", 4096)  # several tiles per matrix
    torch.manual_seed(rows)
    for n, k in SHAPES:
        blocks = quantized(qtype, n, k)
        x = torch.randn(rows, k)
        assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), qtype), x, blocks, qtype)


@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("mode", ["int8", "int16"])
def test_rounded_paths_on_every_instruction_set_are_within_the_bound_and_thread_count_independent(
        qtype: GGMLQuantizationType, mode: str) -> None:
    isas = available_isas()
    assert "scalar" in isas and force_isa("avx512_vnni") == isas[-1]  # never one the CPU lacks
    torch.manual_seed(0)
    with activations_forced(mode):
        for rows, n, k in ((1, 97, 608), (2, 33, 96), (3, 130, 160), (4, 7, 32 * 131), (64, 97, 96)):
            blocks = quantized(qtype, n, k)
            x = torch.randn(rows, k) * torch.logspace(-2, 1, k)
            outs = {isa: on_one_and_two_threads(isa, x, torch.from_numpy(blocks), qtype) for isa in isas}
            for y in outs.values():
                assert_within_rounded_bound(y, x, blocks, qtype, mode)
            assert_paths_agree(outs, x, blocks, qtype)


@native
@pytest.mark.usefixtures("restore_isa")
def test_int16_rounds_256_times_closer_than_int8() -> None:
    """What the int16 form is for: on AVX2 its error against the exact product is near the float path's, far
    under int8's (SmolLM2 teacher-forced: tests/server/model/test_quantized_accuracy.py)."""
    blocks = quantized(Q4_1, 97, 608)
    x = torch.randn(4, 608)
    ref = reference(x, blocks, Q4_1).double()
    force_isa("avx2")
    errors = {}
    for mode in ("float", "int16", "int8"):
        with activations_forced(mode):
            errors[mode] = (quant_matmul(x, torch.from_numpy(blocks), Q4_1).double() - ref).abs().max().item()
    assert errors["int16"] < errors["int8"] / 50 and errors["int16"] < 1e-3 * ref.abs().max().item(), errors


@native
@pytest.mark.usefixtures("int8_activations", "restore_isa")
def test_zero_and_subnormal_activation_blocks() -> None:
    """A block of zeros has scale 0; one whose scale would be subnormal (amax < 1.5e-36) rounds to zeros."""
    blocks = quantized(Q8_0, 7, 96)
    x = torch.randn(3, 96)
    x[0, :32], x[1, 32:64], x[2] = 0.0, x[1, 32:64] * 1e-38, x[2] * 1e-40
    for isa in available_isas():
        force_isa(isa)
        y = quant_matmul(x, torch.from_numpy(blocks), Q8_0)
        assert y.isfinite().all()
        assert_within_rounded_bound(y, x, blocks, Q8_0)


# ---- both

def finite_scales(blocks: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Random block bytes with each fp16 scale (d, and m for MIN_TYPES) made finite: exponent 31 becomes 15."""
    raw = blocks.copy().reshape(blocks.shape[0], -1, BLOCK_BYTES[qtype])
    scales = raw[..., :4 if qtype in MIN_TYPES else 2].copy().view(np.uint16)
    scales[(scales & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)
    raw[..., :scales.shape[-1] * 2] = scales.view(np.uint8)
    return raw.reshape(blocks.shape)


@st.composite
def problems(draw: st.DrawFn, random_bytes: bool):
    qtype = draw(st.sampled_from(TYPES))
    rows, n, blocks_per_row = draw(st.integers(1, 6)), draw(st.integers(1, 9)), draw(st.integers(1, 6))
    k = 32 * blocks_per_row
    values = st.floats(-8, 8, width=32)
    x = draw(hnp.arrays(np.float32, (rows, k), elements=values | st.just(0.0)))
    if random_bytes:
        blocks = finite_scales(draw(hnp.arrays(np.uint8, (n, blocks_per_row * BLOCK_BYTES[qtype]))), qtype)
    else:
        with np.errstate(all="ignore"):  # gguf's quantize divides by the scale of subnormal blocks
            blocks = quantize(draw(hnp.arrays(np.float32, (n, k), elements=values)), qtype)
    return qtype, torch.from_numpy(x), blocks


@native
@pytest.mark.usefixtures("restore_isa")
@pytest.mark.parametrize("random_bytes", [False, True], ids=["quantized", "random-bytes"])
@pytest.mark.parametrize("activations", ["float", "int8", "int16"])
def test_hypothesis_weights_within_the_bound_on_every_instruction_set(activations: str, random_bytes: bool) -> None:
    isas = available_isas()

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems(random_bytes))
    def check(problem) -> None:
        qtype, x, blocks = problem
        outs = {isa: on(isa, quant_matmul, x, torch.from_numpy(blocks), qtype) for isa in isas}
        if activations == "float":
            ref, bound = reference(x, blocks, qtype), float_bound(x, blocks, qtype)
            for y in outs.values():
                assert_within_float_bound(y, x, blocks, qtype, ref, bound)
        else:
            for y in outs.values():
                assert_within_rounded_bound(y, x, blocks, qtype, activations)
            assert_paths_agree(outs, x, blocks, qtype)

    with activations_forced(activations):
        check()


@settings(max_examples=40, deadline=None)
@given(problems(random_bytes=True))
def test_dequantize_rows_has_gguf_bits(problem) -> None:
    qtype, _, blocks = problem
    expected = dequantize(blocks, qtype)
    got = dequantize_rows(torch.from_numpy(blocks), qtype).numpy()
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert dequantize_rows(torch.from_numpy(blocks), qtype, torch.bfloat16).dtype == torch.bfloat16


@native
def test_native_op_checks_its_inputs() -> None:
    op = torch.ops.flotilla.quant_matmul
    blocks = torch.zeros(3, 34, dtype=torch.uint8)
    cases = [((torch.randn(2, 33), blocks, 8), "multiple of 32"),
             ((torch.randn(2, 64), blocks, 8), "blocks has 34 bytes per row; k = 64 takes 68"),
             ((torch.randn(2, 32), blocks, 1), "qtype 1 is none of"),
             ((torch.randn(2, 32, dtype=torch.float64), blocks, 8), "x must be float32"),
             ((torch.randn(2, 32), blocks.view(torch.int8), 8), "blocks must be uint8"),
             ((torch.randn(32), blocks, 8), "x must be [m, k]")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
            op(*args)
    assert op(torch.randn(0, 32), blocks, 8).shape == (0, 3)
    with pytest.raises(RuntimeError, match="none of scalar, avx2"):
        force_isa("sse2")
    before = quant_blocks.activations_setting()
    with pytest.raises(RuntimeError, match="none of float, int8, int16 or auto"):
        force_activations("int4")
    assert quant_blocks.activations_setting() == before


@pytest.mark.parametrize("native_op", [True, False], ids=["native", "fallback"])
def test_leading_dimensions_are_rows(monkeypatch: pytest.MonkeyPatch, native_op: bool) -> None:
    if not native_op:
        monkeypatch.setattr(quant_blocks, "_quant_matmul", None)
    blocks = torch.from_numpy(quantized(Q4_1, 7, 96))
    x = torch.randn(2, 3, 96)
    y = quant_matmul(x, blocks, Q4_1)
    assert y.shape == (2, 3, 7) and torch.equal(y.reshape(6, 7), quant_matmul(x.reshape(6, 96), blocks, Q4_1))


@pytest.mark.parametrize("rows", [1, 3, 31, 32, 40])
def test_a_projection_gives_quant_matmuls_result_on_its_direct_path_and_follows_its_buffers(rows: int) -> None:
    """QuantizedLinear sends a decode step's float32 rows straight to the native op (quant_blocks.few_rows_product)
    and the rest through quant_matmul: either way the product is quant_matmul's, the same bits; and after
    `_apply` (`.to`, `share_memory`) it multiplies the module's buffers as they are then."""
    blocks = torch.from_numpy(quantized(Q4_1, 33, 96).copy())
    layer = QuantizedLinear(96, [(blocks, int(Q4_1))])
    x = torch.randn(rows, 96)
    assert torch.equal(layer(x), quant_matmul(x, blocks, Q4_1))
    assert torch.equal(layer(x.unsqueeze(0)), quant_matmul(x, blocks, Q4_1).unsqueeze(0))  # the general path
    layer._apply(lambda t: t.clone())
    layer.blocks0.copy_(torch.from_numpy(quantized(Q4_1, 33, 96)[::-1].copy()))  # the new buffer, not the old one
    assert torch.equal(layer(x), quant_matmul(x, layer.blocks0, Q4_1))
    assert not torch.equal(layer(x), quant_matmul(x, blocks, Q4_1))


def test_fallback_checks_types_and_widths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant_blocks, "_quant_matmul", None)  # the native op checks its own (above)
    assert quant_blocks.active_activations() == "torch" and force_activations("int8") == "torch"
    with pytest.raises(ValueError, match="no block kernel here"):
        quant_matmul(torch.randn(1, 32), torch.zeros(1, 34, dtype=torch.uint8), GGMLQuantizationType.IQ4_XS)
    with pytest.raises(ValueError, match="do not hold k = 64"):
        quant_matmul(torch.randn(1, 64), torch.zeros(1, 34, dtype=torch.uint8), Q8_0)


@native
def test_environment_variables_pick_the_instruction_set_and_the_activations_at_load() -> None:
    """Read once, at load: FLOTILLA_KERNEL_ISA and FLOTILLA_KERNEL_ACTIVATIONS (another value: auto, and a line
    on stderr); the op reads back the setting and the form it takes there. The processes run side by side."""
    code = (f"import torch; torch.ops.load_library({str(LIBRARY)!r}); "
            "print(torch.ops.flotilla.kernel_isa(''), torch.ops.flotilla.kernel_activations(''))")
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_KERNEL_")}
    runs = [({"FLOTILLA_KERNEL_ISA": "scalar", "FLOTILLA_KERNEL_ACTIVATIONS": "int8"}, "scalar int8:int8"),
            ({"FLOTILLA_KERNEL_ISA": "avx2", "FLOTILLA_KERNEL_ACTIVATIONS": "int16"}, "avx2 int16:int16"),
            ({"FLOTILLA_KERNEL_ISA": "avx2"}, "avx2 auto:int16"),
            ({"FLOTILLA_KERNEL_ISA": "scalar", "FLOTILLA_KERNEL_ACTIVATIONS": "int4"}, "scalar auto:float")]
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**base, **env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for env, _ in runs]
    for proc, (_, expected) in zip(procs, runs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.strip() == expected
    assert "FLOTILLA_KERNEL_ACTIVATIONS=int4 is none of float, int8, int16 or auto; using auto" in err
