"""The packed oneDNN linear path: same results as `F.linear`, repacked when the weight changes, and taken
only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flotilla_server.model import linear as linear_module
from flotilla_server.model.linear import (
    ONEDNN,
    ONEDNN_BFLOAT16,
    Linear,
    pack_one_row,
    uses_native_gemv,
    uses_packed_path,
)

needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN (the plain path is then used)")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 2, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    layer = Linear(96, 200, bias=bias)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        out = layer(x)
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not ONEDNN_BFLOAT16, reason="oneDNN has no bfloat16 kernels for this CPU (plain F.linear then)")
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_packed_bfloat16_linear_matches_f_linear(rows: int) -> None:
    torch.manual_seed(rows)
    layer = Linear(256, 200, bias=False).to(torch.bfloat16)
    x = torch.randn(rows, 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert uses_packed_path(x, layer.weight)
        out = layer(x)
    exact = F.linear(x.float(), layer.weight.float())
    # both accumulate in float32 and round once to bfloat16: within one bfloat16 step of the exact value
    torch.testing.assert_close(out.float(), exact, rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(out, F.linear(x, layer.weight), rtol=2**-7, atol=1e-3)


@needs_onednn
def test_weight_copied_into_is_packed_again() -> None:
    layer = Linear(32, 16, bias=False)
    x = torch.randn(8, 32)
    with torch.inference_mode():
        first = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2.0)
    with torch.inference_mode():
        second = layer(x)
    torch.testing.assert_close(second, 2.0 * first, rtol=1e-5, atol=1e-5)


def test_packed_path_only_where_it_applies() -> None:
    w = torch.randn(16, 32)
    with torch.inference_mode():
        assert uses_packed_path(torch.randn(4, 32), w) == ONEDNN
        assert not uses_packed_path(torch.randn(1, 32), w)  # one row: MKL, unless the runner packs one row
        assert uses_packed_path(torch.randn(1, 32), w, min_rows=1) == ONEDNN
        assert uses_packed_path(torch.randn(1, 32, dtype=torch.bfloat16), w.bfloat16()) == ONEDNN_BFLOAT16
        assert not uses_packed_path(torch.randn(4, 32, dtype=torch.float16), w.half())
        assert not uses_packed_path(torch.randn(4, 32, dtype=torch.bfloat16), w)  # mixed dtypes
        assert not uses_packed_path(torch.randn(2, 4, 32), w)
    assert not uses_packed_path(torch.randn(4, 32), w)  # grad enabled: the oneDNN op has no autograd


def test_linear_keeps_autograd_outside_inference() -> None:
    layer = Linear(8, 4)
    layer(torch.randn(3, 8)).sum().backward()
    assert layer.weight.grad is not None



@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_gives_the_same_bits_on_one_thread_and_on_two(dtype: torch.dtype) -> None:
    """A step's thread count is chosen by measurement (engine/step_threads.py): its results may not depend
    on it, or two runs of one seeded request could differ."""
    if dtype == torch.bfloat16 and not ONEDNN_BFLOAT16:
        pytest.skip("oneDNN has no bfloat16 kernels for this CPU")
    torch.manual_seed(0)
    layer = Linear(1536, 576, bias=False).to(dtype)
    pack_one_row(layer)
    x = torch.randn(1, 1536, dtype=dtype)
    threads, outs = torch.get_num_threads(), []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.inference_mode():
                assert uses_packed_path(x, layer.weight, layer._packed.min_rows)
                outs.append(layer(x))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(*outs)


def test_pack_one_row_reaches_every_packed_weight_of_a_model() -> None:
    from flotilla_server.model import DecoderModel
    from flotilla_server.model.tiny import TINY_CONFIG

    model = DecoderModel(TINY_CONFIG)
    pack_one_row(model)
    assert all(m._packed.min_rows == 1 for m in model.modules() if isinstance(m, Linear))
    assert model._logits_weight.min_rows == 1


def test_the_native_kernel_is_built_and_matches_f_linear() -> None:
    if linear_module.gemv_one_row is None:
        pytest.fail("the native CPU kernel is not built: make setup runs scripts/build_kernels.py")
    torch.manual_seed(3)
    for in_features, bias in ((577, True), (8, False), (2048, False)):  # a tail past the vector width, short rows
        layer = Linear(in_features, 300, bias=bias)
        x = torch.randn(1, in_features)
        with torch.inference_mode():
            assert uses_native_gemv(x, layer.weight)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_the_native_kernel_gives_the_same_bits_on_one_thread_and_on_two() -> None:
    if linear_module.gemv_one_row is None:
        pytest.fail("the native CPU kernel is not built: make setup runs scripts/build_kernels.py")
    w, x = torch.randn(1000, 576), torch.randn(1, 576)
    threads, outs = torch.get_num_threads(), []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            outs.append(linear_module.gemv_one_row(x, w))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(*outs)


def test_the_native_kernel_refuses_what_it_does_not_compute() -> None:
    if linear_module.gemv_one_row is None:
        pytest.fail("the native CPU kernel is not built: make setup runs scripts/build_kernels.py")
    w = torch.randn(16, 32)
    with torch.inference_mode():
        assert not uses_native_gemv(torch.randn(2, 32), w)  # two rows: the packed path
        assert not uses_native_gemv(torch.randn(1, 32), w.t().contiguous().t())  # column-major
        assert not uses_native_gemv(torch.randn(1, 32, dtype=torch.bfloat16), w.bfloat16())
    assert not uses_native_gemv(torch.randn(1, 32), w)  # grad enabled: the op has no autograd
    with pytest.raises(RuntimeError, match=r"x must be \[1, k\]"):
        linear_module.gemv_one_row(torch.randn(2, 32), w)
