"""Q5_0 and Q5_1 kept in their blocks of 32 weights (model/quant_blocks.py; model/kernels/q5_matmul.cpp, and
their int16 path in quant_matmul.cpp): products against F.linear on the weights `gguf.quants.dequantize`
gives, the native dequantizer against gguf's bits, and the modules that multiply with them.

Weights: `gguf.quants.quantize`'s blocks (gguf 0.19 writes both types) and random bytes whose fp16 fields are
made finite (any 5-bit integers, any scales and mins). The bounds are tests/server/model/test_quant_kernels.py's:
float activations (the default on AVX-512, and in int8 mode: these types have no int8 path, so
FLOTILLA_KERNEL_ACTIVATIONS=int8 leaves them on the float path, bit for bit) multiply x by the exact weights,

    |y - ref| <= (k + 64) * 2**-22 * sum_j |x_j| |w_j|  +  2**-100;

int16 activations (the default on AVX2) add the rounding of x per block of 32, amax_b / 65534 per element, with
|d q_j| + |m| in the float term for Q5_1 (its d and m terms are summed apart, as Q4_1's). Each instruction set
this CPU has is held to its bound at 1, 2, 3, 4, 8, 16 and 64 rows (64: quant_matmul's many-row path, and the
kernel itself), for n = 1, 7, 33, 97 (not multiples of any SIMD width) and k = 32, 96, 160, 608 and a row of
131 blocks (the SIMD paths convert scales per 64 blocks: 64 + 64 + 3); under MANY_ROWS rows with the same
bits on one thread and two. The native tests skip when the kernels are not built.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from flotilla_server.model import quant_blocks
from flotilla_server.model.quant_blocks import (
    BLOCK_BYTES,
    MANY_ROWS,
    Q5_0,
    Q5_1,
    dequantize_rows,
    few_rows_product,
    force_isa,
    quant_matmul,
)
from flotilla_server.model.quant_linear import QuantizedEmbedding, QuantizedLinear
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .kernel_isas import assert_dequantizer_bits, assert_rows_independent, available_isas
from .test_quant_kernels import (
    activations_forced,
    assert_paths_agree,
    assert_within_float_bound,
    assert_within_rounded_bound,
    finite_scales,
    float_bound,
    native,
    on_one_and_two_threads,
    reference,
)

TYPES = [Q5_0, Q5_1]
ROWS = [1, 2, 3, 4, 8, 16, 64]
SHAPES = [(n, k) for n in (1, 7, 33, 97) for k in (32, 96, 160, 608)]
LONG_ROWS = [(9, 32 * 131)]  # 64 + 64 + 3 blocks; in parallel when dequantized (9 x 4192 >= 32 Ki weights)


def kernel(x: torch.Tensor, blocks: torch.Tensor, qtype: int) -> torch.Tensor:
    """The native op itself, at every row count."""
    return torch.ops.flotilla.quant_matmul(x, blocks, int(qtype))


@functools.cache
def blocks_of(qtype: GGMLQuantizationType, n: int, k: int, random_bytes: bool = False) -> np.ndarray:
    """gguf's blocks of normal weights, or random bytes with finite fp16 fields."""
    rng = np.random.default_rng([int(qtype), n, k, random_bytes])
    if random_bytes:
        return finite_scales(rng.integers(0, 256, (n, k // 32 * BLOCK_BYTES[qtype]), dtype=np.uint8), qtype)
    return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


def kernel_on_one_and_two_threads(x: torch.Tensor, blocks: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    outs = []
    for count in (1, 2):
        torch.set_num_threads(count)
        outs.append(kernel(x, blocks, qtype))
    assert torch.equal(outs[0], outs[1]), "the kernel's bits differ between one thread and two"
    return outs[0]


# ---- float activations

@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_float_products_within_the_float_bound_on_every_instruction_set(qtype: GGMLQuantizationType,
                                                                        rows: int) -> None:
    """quant_matmul (from MANY_ROWS rows, the many-row path) and the kernel itself; int8 mode gives the float
    path's bits."""
    assert few_rows_product(qtype) is not None, f"{qtype.name} must have a native kernel"
    isas = available_isas()
    torch.manual_seed(rows)
    for n, k in SHAPES + LONG_ROWS:
        blocks = blocks_of(qtype, n, k, random_bytes=n == 33)
        x = torch.randn(rows, k) * torch.logspace(-2, 1, k)  # blocks of different scales
        ref, bound = reference(x, blocks, qtype), float_bound(x, blocks, qtype)
        for isa in isas:
            with activations_forced("float"):
                y = on_one_and_two_threads(isa, x, torch.from_numpy(blocks), qtype)
                assert y.shape == (rows, n) and y.dtype == torch.float32
                assert_within_float_bound(y, x, blocks, qtype, ref, bound)
                if rows >= MANY_ROWS:
                    assert_within_float_bound(kernel_on_one_and_two_threads(x, torch.from_numpy(blocks), qtype),
                                              x, blocks, qtype, ref, bound)
            torch.set_num_threads(1)  # y's: the many-row path's bits may depend on it
            with activations_forced("int8"):
                assert torch.equal(quant_matmul(x, torch.from_numpy(blocks), qtype), y), (isa, n, k)


@native
@pytest.mark.usefixtures("restore_isa")
def test_float_path_takes_x_as_it_is() -> None:
    """A NaN or an infinity stays in its own row; a block of subnormals is multiplied as it is."""
    x = torch.randn(4, 96)
    x[0, 5], x[1, 40], x[2] = float("nan"), float("inf"), x[2] * 1e-40
    with activations_forced("float"):
        for qtype in TYPES:
            blocks = blocks_of(qtype, 7, 96)
            for isa in available_isas():
                force_isa(isa)
                y = quant_matmul(x, torch.from_numpy(blocks), qtype)
                assert y[0].isnan().all() and not y[1].isfinite().any() and y[2:].isfinite().all(), (qtype, isa)
                assert_within_float_bound(y[2:], x[2:], blocks, qtype)
                assert (y[2] != 0).all()


# ---- int16 activations (the default where the products run on AVX2)

@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_int16_products_within_the_rounded_bound_on_every_instruction_set(qtype: GGMLQuantizationType) -> None:
    """Q4_1's int16 code (AVX2 tile; AVX-512 CPUs run it too; plain C++): the bound, the same bits on one thread
    and two, and every path within float rounding of the scalar one (they round x alike)."""
    isas = available_isas()
    torch.manual_seed(int(qtype))
    with activations_forced("int16"):
        for rows, n, k in ((1, 97, 608), (2, 33, 96), (3, 130, 160), (4, 7, 32 * 131), (8, 33, 160), (16, 9, 32)):
            blocks = blocks_of(qtype, n, k, random_bytes=rows == 3)
            x = torch.randn(rows, k) * torch.logspace(-2, 1, k)
            outs = {isa: on_one_and_two_threads(isa, x, torch.from_numpy(blocks), qtype) for isa in isas}
            for y in outs.values():
                assert_within_rounded_bound(y, x, blocks, qtype, "int16")
            assert_paths_agree(outs, x, blocks, qtype)


@native
@pytest.mark.usefixtures("restore_isa")
def test_auto_takes_int16_on_avx2_and_float_elsewhere() -> None:
    blocks = {qtype: torch.from_numpy(blocks_of(qtype, 33, 160)) for qtype in TYPES}
    x = torch.randn(3, 160)
    for isa in available_isas():
        force_isa(isa)
        for qtype in TYPES:
            with activations_forced("auto"):
                y = quant_matmul(x, blocks[qtype], qtype)
            with activations_forced("int16" if isa == "avx2" else "float"):
                assert torch.equal(quant_matmul(x, blocks[qtype], qtype), y), (isa, qtype.name)


@native
@pytest.mark.usefixtures("restore_isa")
@pytest.mark.parametrize("activations", ["float", "int16"])
def test_a_rows_result_does_not_depend_on_the_other_rows(activations: str) -> None:
    with activations_forced(activations):
        assert_rows_independent(TYPES, lambda qtype: torch.from_numpy(blocks_of(qtype, 33, 160)), 160)


@st.composite
def problems(draw: st.DrawFn):
    qtype = draw(st.sampled_from(TYPES))
    rows, n, blocks_per_row = draw(st.integers(1, 6)), draw(st.integers(1, 9)), draw(st.integers(1, 6))
    k = 32 * blocks_per_row
    values = st.floats(-8, 8, width=32)
    x = draw(hnp.arrays(np.float32, (rows, k), elements=values | st.just(0.0)))
    if draw(st.booleans()):
        blocks = finite_scales(draw(hnp.arrays(np.uint8, (n, blocks_per_row * BLOCK_BYTES[qtype]))), qtype)
    else:
        with np.errstate(all="ignore"):  # gguf's quantize divides by the scale of subnormal blocks
            blocks = quantize(draw(hnp.arrays(np.float32, (n, k), elements=values)), qtype)
    return qtype, torch.from_numpy(x), blocks


@native
@pytest.mark.usefixtures("restore_isa")
@pytest.mark.parametrize("activations", ["float", "int16"])
def test_hypothesis_blocks_within_the_bound_on_every_instruction_set(activations: str) -> None:
    isas = available_isas()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems())
    def check(problem) -> None:
        qtype, x, blocks = problem
        outs = {}
        for isa in isas:
            force_isa(isa)
            outs[isa] = quant_matmul(x, torch.from_numpy(blocks), qtype)
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


# ---- the many-row path and the dequantizer

@native
@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("activations", ["float", "int16", "int8"])
def test_many_row_path_decodes_tiles(monkeypatch: pytest.MonkeyPatch, activations: str) -> None:
    """From MANY_ROWS rows, in every mode (no int8 path keeps the kernel): tiles of decoded weights (several
    here, the last one short) and torch.mm, within the float bound on one thread and two."""
    calls = []
    dequantize_blocks = quant_blocks._dequantize_blocks
    monkeypatch.setattr(quant_blocks, "_dequantize_blocks", lambda *args: calls.append(1) or dequantize_blocks(*args))
    monkeypatch.setattr(quant_blocks, "TILE_BYTES", 40 * 4 * 608)  # 40 rows of 608 weights
    torch.manual_seed(1)
    with activations_forced(activations):
        for qtype in TYPES:
            blocks = blocks_of(qtype, 97, 608)
            for rows in (MANY_ROWS - 1, MANY_ROWS, 100):
                x = torch.randn(rows, 608)
                calls.clear()
                for count in (1, 2):
                    torch.set_num_threads(count)
                    y = quant_matmul(x, torch.from_numpy(blocks), qtype)
                    if rows >= MANY_ROWS or activations != "int16":
                        assert_within_float_bound(y, x, blocks, qtype)
                    else:
                        assert_within_rounded_bound(y, x, blocks, qtype, "int16")
                assert bool(calls) == (rows >= MANY_ROWS), (qtype, rows, len(calls))


@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("blocks_from", ["quantized", "finite-bytes", "any-bytes"])
def test_native_dequantizer_has_gguf_bits_on_every_instruction_set(qtype: GGMLQuantizationType,
                                                                    blocks_from: str) -> None:
    """Any bytes: NaN and infinite scales, and negative ones, whose Q5_0 zeros (q = 16) are -0; and the torch
    decoders (an embedding's lookup) alike for finite scales."""
    rng = np.random.default_rng(int(qtype))
    for n, k in [(1, 32), (7, 96), (33, 160), (97, 608), *LONG_ROWS]:
        if blocks_from == "any-bytes":
            blocks = rng.integers(0, 256, (n, k // 32 * BLOCK_BYTES[qtype]), dtype=np.uint8)
        else:
            blocks = blocks_of(qtype, n, k, random_bytes=blocks_from == "finite-bytes")
        with np.errstate(all="ignore"):
            expected = dequantize(blocks, qtype).view(np.uint32)
        assert_dequantizer_bits(blocks, qtype, expected)
        if blocks_from != "any-bytes":  # the torch decoders: gguf's bits for finite scales (NaN payloads may differ)
            got = dequantize_rows(torch.from_numpy(blocks), qtype).numpy()
            assert np.array_equal(got.view(np.uint32), expected)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 3, MANY_ROWS + 8])
def test_torch_fallback_within_the_float_bound(monkeypatch: pytest.MonkeyPatch, qtype: GGMLQuantizationType,
                                               rows: int) -> None:
    """A build without a compiler: the torch decoders, tiles of 4 KiB here."""
    monkeypatch.setattr(quant_blocks, "_quant_matmul", None)
    monkeypatch.setattr(quant_blocks, "FALLBACK_TILE_BYTES", 4096)
    assert few_rows_product(qtype) is None
    torch.manual_seed(rows)
    for n, k in ((7, 96), (33, 608)):
        blocks = blocks_of(qtype, n, k)
        x = torch.randn(rows, k)
        assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), qtype), x, blocks, qtype)


@native
def test_a_library_without_q5_kernels_leaves_them_to_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """One built before them refuses their type ids: quant_blocks checks once, at import."""
    assert quant_blocks._NATIVE_Q5 and quant_blocks._library_multiplies(Q5_1, "Q5_1")
    monkeypatch.setattr(quant_blocks, "_NATIVE_Q5", False)
    monkeypatch.setattr(quant_blocks, "_quant_matmul", lambda *args: pytest.fail("the native kernel ran"))
    assert few_rows_product(Q5_0) is None
    blocks = blocks_of(Q5_1, 7, 96)
    x = torch.randn(2, 96)
    assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), Q5_1), x, blocks, Q5_1)


@native
def test_native_ops_check_q5_shapes() -> None:
    blocks = torch.zeros(3, 22, dtype=torch.uint8)
    cases = [((torch.randn(2, 48), blocks, 6), "k = 48 must be a positive multiple of 32"),
             ((torch.randn(2, 64), blocks, 6), "blocks has 22 bytes per row; k = 64 takes 44"),
             ((torch.randn(2, 32), blocks, 7), "blocks has 22 bytes per row; k = 32 takes 24")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            kernel(*args)
    with pytest.raises(RuntimeError, match="22-byte blocks of 32 weights do not fill out"):
        torch.ops.flotilla.dequantize_blocks(blocks, 6, torch.empty(3, 64))
    assert kernel(torch.randn(0, 32), blocks, 6).shape == (0, 3)


# ---- the modules

@pytest.mark.parametrize("rows", [1, 5, MANY_ROWS + 3])
def test_projections_and_a_tied_head_multiply_their_blocks(rows: int) -> None:
    """QuantizedLinear (one part: the native op straight; Q5_0 and Q5_1 parts side by side with a bias: the
    general path) and QuantizedEmbedding (its lookup gguf's bits, its tied head quant_matmul's product)."""
    parts = [(torch.from_numpy(blocks_of(qtype, n, 160).copy()), int(qtype)) for qtype, n in ((Q5_0, 33), (Q5_1, 7))]
    x = torch.randn(rows, 160)
    for blocks, qtype in parts:
        assert torch.equal(QuantizedLinear(160, [(blocks, qtype)])(x), quant_matmul(x, blocks, qtype))
    bias = torch.randn(40)
    both = QuantizedLinear(160, parts, bias=bias)
    want = torch.cat([quant_matmul(x, blocks, qtype) for blocks, qtype in parts], dim=-1) + bias
    assert both.qtypes == (int(Q5_0), int(Q5_1)) and torch.equal(both(x), want)
    for blocks, qtype in parts:
        embedding = QuantizedEmbedding(blocks, qtype, 160, torch.float32)
        ids = torch.tensor([0, 6, 3, 6])
        assert torch.equal(embedding(ids), torch.from_numpy(dequantize(blocks.numpy(), qtype))[ids])
        assert torch.equal(embedding.logits(x), quant_matmul(x, blocks, qtype))
