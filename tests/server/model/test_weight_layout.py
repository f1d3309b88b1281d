"""Without the native one-row kernel, float32 CPU Linear weights are column-major (MKL's fast one-row
layout, model/linear.py) through every way a model is built, and the layout changes no value; with it,
they stay row-major."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flotilla_server.model import DecoderModel, load_model
from flotilla_server.model import linear as linear_module
from flotilla_server.model.linear import Linear, column_major, is_column_major
from flotilla_server.model.tiny import TINY_CONFIG


@pytest.fixture
def without_native_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_module, "COLUMN_MAJOR_FLOAT32", True)
    monkeypatch.setattr(linear_module, "gemv_one_row", None)


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, Linear)]


def test_column_major_keeps_values_and_shape() -> None:
    w = torch.randn(5, 3)
    c = column_major(w)
    assert c.shape == w.shape and torch.equal(c, w) and is_column_major(c) and not is_column_major(w)


def test_float32_cpu_weights_are_column_major_and_others_row_major(without_native_kernel) -> None:
    assert all(is_column_major(w) for w in linear_weights(load_model("tiny", "float32", "cpu").model))
    # bfloat16 on CPU ran 12x slower column-major: it stays row-major
    assert all(w.is_contiguous() for w in linear_weights(load_model("tiny", "bfloat16", "cpu").model))
    for dtype, column in ((torch.float32, True), (torch.bfloat16, False)):
        with torch.device("meta"):
            net = DecoderModel(TINY_CONFIG).to(dtype)
        weights = linear_weights(net.to_empty(device="cpu"))
        assert weights and all(is_column_major(w) == column and w.dtype == dtype for w in weights)


def test_a_cast_changes_the_layout_and_keeps_the_values(without_native_kernel) -> None:
    layer = Linear(6, 4)
    before = layer.weight.detach().clone()
    assert is_column_major(layer.weight)
    layer.to(torch.bfloat16)
    assert layer.weight.is_contiguous() and torch.equal(layer.weight, before.bfloat16())
    layer.float()
    assert is_column_major(layer.weight) and torch.equal(layer.weight, before.bfloat16().float())


def test_copy_into_a_column_major_weight_keeps_layout_and_values(without_native_kernel) -> None:
    layer = Linear(6, 4, bias=False)
    source = torch.randn(4, 6)
    with torch.no_grad():
        layer.weight.copy_(source)
    assert is_column_major(layer.weight) and torch.equal(layer.weight, source)
    assert torch.equal(layer.state_dict()["weight"], source)
    x = torch.randn(1, 6)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, source), rtol=1e-6, atol=1e-6)


def test_with_the_native_kernel_float32_weights_stay_row_major() -> None:
    if linear_module.gemv_one_row is None:
        pytest.fail("the native CPU kernel is not built: make setup runs scripts/build_kernels.py")
    assert all(w.is_contiguous() for w in linear_weights(load_model("tiny", "float32", "cpu").model))
