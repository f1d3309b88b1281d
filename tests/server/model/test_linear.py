"""The packed oneDNN linear path: same results as `F.linear`, repacked when the weight changes, and taken
only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flotilla_server.model.linear import ONEDNN, Linear, uses_packed_path

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
        assert not uses_packed_path(torch.randn(1, 32), w)  # one row: MKL is faster
        assert not uses_packed_path(torch.randn(4, 32, dtype=torch.bfloat16), w.bfloat16())
        assert not uses_packed_path(torch.randn(2, 4, 32), w)
    assert not uses_packed_path(torch.randn(4, 32), w)  # grad enabled: the oneDNN op has no autograd


def test_linear_keeps_autograd_outside_inference() -> None:
    layer = Linear(8, 4)
    layer(torch.randn(3, 8)).sum().backward()
    assert layer.weight.grad is not None
