"""The k-quants Q4_K and Q6_K kept in their super-blocks of 256 weights (model/quant_blocks.py,
model/kernels/kquant_matmul.cpp): products against F.linear on the weights `gguf.quants.dequantize` gives,
dequantization against gguf's bits, and a small GGUF model of Q4_K, Q6_K and Q8_0 tensors served from its
blocks against the same file dequantized.

gguf 0.19 cannot quantize these types, so the weights are random super-blocks (any 6-bit scales and mins,
any integers) whose fp16 scale fields are made finite. The kernels multiply x as it is by exactly gguf's
weights, and the k-quants have no int8-activation path (FLOTILLA_KERNEL_ACTIVATIONS=int8 leaves them on the
float path, bit for bit), so each output element is held to the float bound that
tests/server/model/test_quant_kernels.py states:

    |y - ref| <= (k + 64) * 2**-22 * sum_j |x_j| |w_j|  +  2**-100

on each instruction set this CPU has, at 1, 2, 3, 4, 8, 16 and 64 rows, n not a multiple of any SIMD width,
k = 256, 512, 768 and a row of 17 super-blocks (more than the SIMD paths convert scales for at a time);
under MANY_ROWS rows with the same bits on one thread and two. The native dequantizer is bit-equal to gguf
for any bytes (NaN and infinite scales too), the torch fallback's for finite scales. The native tests skip
when the kernels are not built.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from flotilla_server.model import load_model, quant_blocks
from flotilla_server.model.gguf_file import GGUFFile
from flotilla_server.model.quant_blocks import (
    BLOCK_BYTES,
    MANY_ROWS,
    Q4_K,
    Q6_K,
    dequantize_rows,
    force_isa,
    quant_matmul,
)
from flotilla_server.model.quant_linear import QuantizedEmbedding, QuantizedLinear
from flotilla_server.model.source import gguf_tensors
from flotilla_server.model_cache.footprint import gguf_weight_bytes
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .gguf_files import T, write_llama_gguf
from .kernel_isas import assert_dequantizer_bits, assert_rows_independent, available_isas
from .test_int8_loading import logits
from .test_quant_kernels import (
    activations_forced,
    assert_within_float_bound,
    float_bound,
    native,
    on_one_and_two_threads,
    reference,
)

TYPES = [Q4_K, Q6_K]
SCALE_FIELDS = {Q4_K: (0, 2), Q6_K: (208,)}  # byte offsets of each super-block's fp16 fields (d, dmin; d)
ROWS = [1, 2, 3, 4, 8, 16, 64]
SHAPES = [(n, k) for n in (1, 7, 33, 97) for k in (256, 512, 768)]
LONG_ROWS = [(9, 256 * 17)]  # in parallel when dequantized (9 x 4352 >= 32 Ki weights), and k >= 1536


def finite_scales(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """uint8 [rows, bytes per row] with each fp16 scale field made finite: exponent 31 becomes 15."""
    blocks = raw.copy().reshape(raw.shape[0], -1, BLOCK_BYTES[qtype])
    for at in SCALE_FIELDS[qtype]:
        halves = blocks[..., at:at + 2].copy().view(np.uint16)
        halves[(halves & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)
        blocks[..., at:at + 2] = halves.view(np.uint8)
    return blocks.reshape(raw.shape)


@functools.cache
def random_blocks(qtype: GGMLQuantizationType, n: int, k: int, finite: bool = True) -> np.ndarray:
    rng = np.random.default_rng([int(qtype), n, k])
    raw = rng.integers(0, 256, (n, k // 256 * BLOCK_BYTES[qtype]), dtype=np.uint8)
    return finite_scales(raw, qtype) if finite else raw


# ---- products

@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_products_within_the_float_bound_on_every_instruction_set(qtype: GGMLQuantizationType, rows: int) -> None:
    """quant_matmul (from MANY_ROWS rows, the many-row path) and the native kernel itself at every row count."""
    isas = available_isas()
    torch.manual_seed(rows)
    with activations_forced("float"):
        for n, k in SHAPES + LONG_ROWS:
            blocks = random_blocks(qtype, n, k)
            x = torch.randn(rows, k) * torch.logspace(-2, 1, k)  # super-blocks of different scales
            ref, bound = reference(x, blocks, qtype), float_bound(x, blocks, qtype)
            for isa in isas:
                y = on_one_and_two_threads(isa, x, torch.from_numpy(blocks), qtype)
                assert y.shape == (rows, n) and y.dtype == torch.float32
                assert_within_float_bound(y, x, blocks, qtype, ref, bound)
                if rows >= MANY_ROWS:  # the kernel itself: the bound, and the same bits on one thread and two
                    kernels = []
                    for count in (1, 2):
                        torch.set_num_threads(count)
                        kernels.append(torch.ops.flotilla.quant_matmul(x, torch.from_numpy(blocks), int(qtype)))
                    assert torch.equal(kernels[0], kernels[1]), isa
                    assert_within_float_bound(kernels[0], x, blocks, qtype, ref, bound)


@native
@pytest.mark.usefixtures("restore_isa")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_int8_activations_leave_the_k_quants_on_the_float_path(qtype: GGMLQuantizationType) -> None:
    blocks = torch.from_numpy(random_blocks(qtype, 33, 512))
    torch.manual_seed(0)
    for rows in (1, 5, MANY_ROWS, 40):
        x = torch.randn(rows, 512)
        for isa in available_isas():
            force_isa(isa)
            with activations_forced("float"):
                y = quant_matmul(x, blocks, qtype)
            with activations_forced("int8"):
                assert torch.equal(quant_matmul(x, blocks, qtype), y), (isa, rows)


@native
@pytest.mark.usefixtures("restore_isa")
def test_a_rows_result_does_not_depend_on_the_other_rows() -> None:
    assert_rows_independent(TYPES, lambda qtype: torch.from_numpy(random_blocks(qtype, 33, 768)), 768)


@native
@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("activations", ["float", "int8"])
def test_many_row_path_decodes_tiles(monkeypatch: pytest.MonkeyPatch, activations: str) -> None:
    """From MANY_ROWS rows, in either mode: tiles of decoded weights (several here, the last one short) and
    torch.mm, within the bound on one thread and two."""
    calls = []
    dequantize_blocks = quant_blocks._dequantize_blocks
    monkeypatch.setattr(quant_blocks, "_dequantize_blocks", lambda *args: calls.append(1) or dequantize_blocks(*args))
    monkeypatch.setattr(quant_blocks, "TILE_BYTES", 40 * 4 * 768)  # 40 rows of 768 weights
    torch.manual_seed(1)
    with activations_forced(activations):
        for qtype in TYPES:
            blocks = random_blocks(qtype, 97, 768)
            for rows in (MANY_ROWS - 1, MANY_ROWS, 100):
                x = torch.randn(rows, 768)
                calls.clear()
                for count in (1, 2):
                    torch.set_num_threads(count)
                    assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), qtype), x, blocks, qtype)
                assert bool(calls) == (rows >= MANY_ROWS), (qtype, rows, len(calls))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_torch_fallback_within_the_float_bound(monkeypatch: pytest.MonkeyPatch, qtype: GGMLQuantizationType,
                                               rows: int) -> None:
    monkeypatch.setattr(quant_blocks, "_quant_matmul", None)
    monkeypatch.setattr(quant_blocks, "FALLBACK_TILE_BYTES", 4096)  # 4 rows of 256 weights per tile
    torch.manual_seed(rows)
    for n, k in ((7, 256), (33, 768)):
        blocks = random_blocks(qtype, n, k)
        x = torch.randn(rows, k)
        assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), qtype), x, blocks, qtype)


@native
def test_a_library_without_k_quant_kernels_leaves_them_to_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """One built before them refuses their type ids: quant_blocks checks once, at import."""
    assert quant_blocks._NATIVE_KQUANTS and quant_blocks._library_multiplies(Q4_K, "Q4_K and Q6_K")
    monkeypatch.setattr(quant_blocks, "_NATIVE_KQUANTS", False)
    monkeypatch.setattr(quant_blocks, "_quant_matmul", lambda *args: pytest.fail("the native kernel ran"))
    blocks = random_blocks(Q6_K, 7, 512)
    x = torch.randn(2, 512)
    assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), Q6_K), x, blocks, Q6_K)


@st.composite
def problems(draw: st.DrawFn):
    qtype = draw(st.sampled_from(TYPES))
    rows, n, super_blocks = draw(st.integers(1, 5)), draw(st.integers(1, 9)), draw(st.integers(1, 2))
    k = 256 * super_blocks
    x = draw(hnp.arrays(np.float32, (rows, k), elements=st.floats(-8, 8, width=32) | st.just(0.0)))
    raw = draw(hnp.arrays(np.uint8, (n, super_blocks * BLOCK_BYTES[qtype])))
    return qtype, torch.from_numpy(x), finite_scales(raw, qtype)


@native
@pytest.mark.usefixtures("restore_isa")
def test_hypothesis_blocks_within_the_bound_on_every_instruction_set() -> None:
    isas = available_isas()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems())
    def check(problem) -> None:
        qtype, x, blocks = problem
        ref, bound = reference(x, blocks, qtype), float_bound(x, blocks, qtype)
        for isa in isas:
            force_isa(isa)
            assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), qtype), x, blocks, qtype, ref, bound)

    with activations_forced("float"):
        check()


@native
def test_native_ops_check_k_quant_shapes() -> None:
    matmul, dequantize_blocks = torch.ops.flotilla.quant_matmul, torch.ops.flotilla.dequantize_blocks
    blocks = torch.zeros(3, 144, dtype=torch.uint8)
    cases = [((torch.randn(2, 288), blocks, 12), "k = 288 must be a positive multiple of 256"),
             ((torch.randn(2, 512), blocks, 12), "blocks has 144 bytes per row; k = 512 takes 288"),
             ((torch.randn(2, 256), blocks, 14), "blocks has 144 bytes per row; k = 256 takes 210")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            matmul(*args)
    with pytest.raises(RuntimeError, match="blocks of 256 weights do not fill out"):
        dequantize_blocks(blocks, 12, torch.empty(3, 288))
    assert matmul(torch.randn(0, 256), blocks, 12).shape == (0, 3)


def test_fallback_checks_k_quant_widths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant_blocks, "_quant_matmul", None)
    with pytest.raises(ValueError, match="Q4_K blocks of 144 bytes per row do not hold k = 288"):
        quant_matmul(torch.randn(1, 288), torch.zeros(1, 144, dtype=torch.uint8), Q4_K)


# ---- dequantization

@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("finite", [True, False], ids=["finite-scales", "any-bytes"])
def test_native_dequantizer_has_gguf_bits_on_every_instruction_set(qtype: GGMLQuantizationType, finite: bool) -> None:
    for n, k in [(1, 256), (7, 512), (33, 768), (97, 512), *LONG_ROWS]:
        blocks = random_blocks(qtype, n, k, finite)
        with np.errstate(all="ignore"):
            expected = dequantize(blocks, qtype).view(np.uint32)
        assert_dequantizer_bits(blocks, qtype, expected)


@settings(max_examples=40, deadline=None)
@given(problems())
def test_dequantize_rows_has_gguf_bits(problem) -> None:
    qtype, _, blocks = problem
    expected = dequantize(blocks, qtype)
    got = dequantize_rows(torch.from_numpy(blocks), qtype).numpy()
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert dequantize_rows(torch.from_numpy(blocks), qtype, torch.bfloat16).dtype == torch.bfloat16


# ---- a model: Q4_K_M's mix of types, held as blocks

# Q4_K by default; as llama.cpp's Q4_K_M gives V, the down projection and the head Q6_K; K in Q8_0 here, so
# that the fused Q/K/V projection holds three types side by side
MIXED = {"attn_k": T.Q8_0, "attn_v": T.Q6_K, "ffn_down": T.Q6_K, "output": T.Q6_K}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("kquant") / "m.Q4_K_M.gguf", T.Q4_K, tensor_types=MIXED)


def test_a_q4_k_m_model_keeps_its_blocks_and_gives_the_dequantized_models_logits(mixed_gguf: Path) -> None:
    blocks = load_model(str(mixed_gguf), "float32", "cpu", "gguf")
    dense = load_model(str(mixed_gguf), "float32", "cpu", "none")
    net = blocks.model
    assert net.quantization() == "gguf:Q4_K+Q6_K+Q8_0" and dense.model.quantization() == "none"
    qkv = net.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantizedLinear) and qkv.qtypes == (int(T.Q4_K), int(T.Q8_0), int(T.Q6_K))
    assert isinstance(net.embed_tokens, QuantizedEmbedding) and isinstance(net.lm_head, QuantizedLinear)
    # every matrix held as the file's bytes; the norms in float32
    file = GGUFFile(mixed_gguf)
    matrices = sum(t.data.nbytes for t in file.tensors if len(t.shape) == 2)
    norms = sum(t.data.nbytes for t in file.tensors if len(t.shape) == 1)
    assert net.weight_bytes() == matrices + norms
    assert gguf_weight_bytes(blocks.config, gguf_tensors(str(mixed_gguf)), "float32", "cpu") == net.weight_bytes()
    ids = list(range(3, 40))
    with torch.inference_mode():
        embedded = net.embed_tokens(torch.tensor(ids))
    assert torch.equal(embedded, dense.model.embed_tokens.weight[ids])  # gguf's bits
    # float activations for the Q8_0 part too (FLOTILLA_KERNEL_ACTIVATIONS=int8 would round them)
    native_kernels = quant_blocks._quant_matmul is not None
    with activations_forced("float") if native_kernels else contextlib.nullcontext():
        for length in (9, MANY_ROWS + 5):  # the kernels, then the many-row path
            got, want = logits(net, ids[:length]), logits(dense.model, ids[:length])
            assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (length, (got - want).abs().max())
