"""Products with per-channel int8 weights (model/int8_weights.py, `int8_matmul` in
model/kernels/quant_matmul.cpp) against F.linear(x, dequantize(W)), W = w.float() * scales[:, None].

The kernel converts each weight row's integers to float (exact), multiplies them with x by FMA and scales
the row's sum once; the reference rounds each w * s, then sums. Both are x @ (w * s).T up to float rounding,
so each output element (x row, weight row) is held to the block kernels' float bound
(tests/server/model/test_quant_kernels.py):

    |y - ref| <= (k + 64) * 2**-22 * sum_j |x_j| |W_j|  +  2**-100

Each instruction set this CPU has (forced through `force_isa`) is held to it at 1, 2, 3, 4, 8, 16 and 64
rows, odd n and k multiples of 16 (the kernel's rule), and gives the same bits on one thread and two; from
MANY_ROWS rows the wrapper takes the native dequantizer (torch's bits for w * s, on every instruction set)
and torch.mm, held to the same bound. The native tests skip when the kernels are not built.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flotilla_server.model import int8_weights, quant_blocks
from flotilla_server.model.int8_weights import (
    INT8_K_MULTIPLE,
    dequantize_int8_rows,
    int8_matmul,
    quantize_int8,
)
from flotilla_server.model.quant_blocks import force_isa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from .kernel_isas import available_isas

ROWS = [1, 2, 3, 4, 8, 16, 64]
SHAPES = [(n, k) for n in (1, 7, 33, 97) for k in (16, 48, 80, 576)]  # k % 64: 16, 48, 16, 0 (every tail)

native = pytest.mark.skipif(int8_weights._int8_matmul is None,
                            reason="the native kernels are not built (make setup runs scripts/build_kernels.py)")





def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1000 + n * k)
    return quantize_int8(torch.randn(n, k, generator=g) * torch.logspace(-2, 1, n)[:, None])


def dequantized(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return w.float() * scales[:, None]


def assert_within_float_bound(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> None:
    weight = dequantized(w, scales)
    ref = F.linear(x, weight)
    bound = (x.shape[1] + 64) * 2**-22 * (x.double().abs() @ weight.double().abs().T) + 2**-100
    worst = ((y.double() - ref.double()).abs() - bound).max()
    assert worst <= 0, f"{tuple(x.shape)} x {tuple(w.shape)}: error exceeds the bound by {worst.item():.3g}"


def test_quantize_int8_is_per_channel_symmetric() -> None:
    weight = torch.randn(5, 32)
    weight[2] = 0.0
    weight[3, 7] = -10.0
    w, scales = quantize_int8(weight.to(torch.bfloat16).t().contiguous().t())  # any dtype and layout
    assert w.dtype == torch.int8 and scales.dtype == torch.float32 and w.is_contiguous()
    source = weight.to(torch.bfloat16).float()
    assert torch.equal(scales, source.abs().amax(1) / 127)
    assert scales[2] == 0 and (w[2] == 0).all() and w[3, 7] == -127
    assert w.abs().amax(1)[[0, 1, 3, 4]].eq(127).all() and w.abs().max() <= 127
    # each weight within half a step of its row's scale
    assert ((dequantized(w, scales) - source).abs() <= scales[:, None] / 2 * (1 + 1e-6)).all()


@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("rows", ROWS)
def test_kernel_within_the_float_bound_on_every_instruction_set(rows: int) -> None:
    """The op itself (the kernel at every row count, 64 included), on one thread and two: the same bits."""
    op = torch.ops.flotilla.int8_matmul
    torch.manual_seed(rows)
    for n, k in SHAPES:
        w, scales = weights(n, k)
        x = torch.randn(rows, k) * torch.logspace(-2, 1, k)
        for isa in available_isas():
            assert force_isa(isa) == isa
            outs = []
            for count in (1, 2):
                torch.set_num_threads(count)
                outs.append(op(x, w, scales))
            assert torch.equal(outs[0], outs[1]), f"{isa}: bits differ between one thread and two"
            assert outs[0].shape == (rows, n) and outs[0].dtype == torch.float32
            assert_within_float_bound(outs[0], x, w, scales)


@native
@pytest.mark.usefixtures("restore_isa")
def test_a_rows_result_does_not_depend_on_the_other_rows() -> None:
    w, scales = weights(33, 80)
    x = torch.randn(7, 80)
    for isa in available_isas():
        force_isa(isa)
        y = int8_matmul(x, w, scales)
        for start, end in ((0, 1), (2, 3), (1, 7), (3, 5), (6, 7)):
            assert torch.equal(int8_matmul(x[start:end], w, scales), y[start:end]), (isa, start, end)


@native
@pytest.mark.usefixtures("restore_isa", "threads")
def test_native_dequantizer_has_torchs_bits_on_every_instruction_set() -> None:
    op = torch.ops.flotilla.dequantize_int8
    for n, k in ((1, 16), (7, 48), (97, 576), (9, 4000)):  # 97 x 576 and 9 x 4000: in parallel; any k
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
        scales = torch.randn(n) * 1e-3
        scales[0] = 0.0
        expected = dequantized(w, scales)
        for isa in available_isas():
            force_isa(isa)
            for count in (1, 2):
                torch.set_num_threads(count)
                out = torch.full((n, k), float("nan"))
                op(w, scales, out)
                assert torch.equal(out.view(torch.int32), expected.view(torch.int32)), (isa, count, n, k)


@native
@pytest.mark.usefixtures("threads")
def test_many_row_path_within_the_float_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """From MANY_ROWS rows the wrapper decodes tiles (several here, the last one short) and takes torch.mm."""
    calls = []
    dequantize = int8_weights._dequantize_int8
    monkeypatch.setattr(int8_weights, "_dequantize_int8", lambda *args: calls.append(1) or dequantize(*args))
    monkeypatch.setattr(int8_weights, "TILE_BYTES", 40 * 4 * 576)  # 40 rows of 576 weights
    many = quant_blocks.MANY_ROWS
    torch.manual_seed(0)
    for n, k in ((97, 576), (33, 80)):
        w, scales = weights(n, k)
        for rows in (many - 1, many, 64, 200):
            x = torch.randn(rows, k) * torch.logspace(-2, 1, k)
            calls.clear()
            for count in (1, 2):
                torch.set_num_threads(count)
                y = int8_matmul(x, w, scales)
                assert y.shape == (rows, n) and y.is_contiguous()
                assert_within_float_bound(y, x, w, scales)
            assert bool(calls) == (rows >= many), (rows, len(calls))


@pytest.mark.parametrize("rows", ROWS)
def test_torch_fallback_within_the_float_bound(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    monkeypatch.setattr(int8_weights, "_int8_matmul", None)
    monkeypatch.setattr(int8_weights, "FALLBACK_TILE_BYTES", 4096)  # several tiles per matrix
    torch.manual_seed(rows)
    for n, k in SHAPES:
        w, scales = weights(n, k)
        x = torch.randn(2, 3, k)[:, :1].expand(2, rows, k)  # leading dimensions are rows
        y = int8_matmul(x, w, scales)
        assert y.shape == (2, rows, n)
        assert_within_float_bound(y.reshape(-1, n), x.reshape(-1, k), w, scales)


@st.composite
def problems(draw: st.DrawFn):
    rows, n, k = draw(st.integers(1, 6)), draw(st.integers(1, 9)), INT8_K_MULTIPLE * draw(st.integers(1, 9))
    x = draw(hnp.arrays(np.float32, (rows, k), elements=st.floats(-8, 8, width=32)))
    w = draw(hnp.arrays(np.int8, (n, k)))  # -128 included: the kernel takes any int8
    scales = draw(hnp.arrays(np.float32, (n,), elements=st.floats(0, 4, width=32)))
    return torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(scales)


@native
@pytest.mark.usefixtures("restore_isa")
def test_hypothesis_weights_within_the_bound_on_every_instruction_set() -> None:
    isas = available_isas()

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems())
    def check(problem) -> None:
        x, w, scales = problem
        for isa in isas:
            force_isa(isa)
            assert_within_float_bound(int8_matmul(x, w, scales), x, w, scales)

    check()


@native
def test_native_ops_check_their_inputs() -> None:
    op = torch.ops.flotilla.int8_matmul
    w, scales = torch.zeros(3, 32, dtype=torch.int8), torch.ones(3)
    cases = [((torch.randn(2, 24), w[:, :24].contiguous(), scales), "multiple of 16"),
             ((torch.randn(2, 16), w, scales), r"x must be \[m, k\] for w \[n, k\]"),
             ((torch.randn(2, 32), w.view(torch.uint8), scales), "w must be int8"),
             ((torch.randn(2, 32), w, scales.double()), "scales must be float32"),
             ((torch.randn(2, 32), w, torch.ones(2)), "scales \\[n\\]"),
             ((torch.randn(2, 32).double(), w, scales), "x must be float32"),
             ((torch.randn(2, 32), w.t().contiguous().t(), scales), "must be contiguous")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            op(*args)
    assert op(torch.randn(0, 32), w, scales).shape == (0, 3)
    with pytest.raises(RuntimeError, match="is not w's shape"):
        torch.ops.flotilla.dequantize_int8(w, scales, torch.empty(3, 16))


def test_dequantize_int8_rows() -> None:
    w, scales = weights(7, 48)
    assert torch.equal(dequantize_int8_rows(w, scales), dequantized(w, scales))
    assert dequantize_int8_rows(w, scales, torch.bfloat16).dtype == torch.bfloat16
