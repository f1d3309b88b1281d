"""Linear weights are column-major (the fast one-row layout, model/linear.py) through every way a model is
built, and the layout changes no value."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flotilla_server.model import DecoderModel, load_model
from flotilla_server.model.linear import Linear, column_major, is_column_major
from flotilla_server.model.tiny import TINY_CONFIG


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, Linear)]


def test_column_major_keeps_values_and_shape() -> None:
    w = torch.randn(5, 3)
    c = column_major(w)
    assert c.shape == w.shape and torch.equal(c, w) and is_column_major(c) and not is_column_major(w)


def test_float32_cpu_weights_are_column_major_and_others_row_major() -> None:
    assert all(is_column_major(w) for w in linear_weights(load_model("tiny", "float32", "cpu").model))
    # bfloat16 on CPU ran 12x slower column-major: it stays row-major
    assert all(w.is_contiguous() for w in linear_weights(load_model("tiny", "bfloat16", "cpu").model))
    for dtype, column in ((torch.float32, True), (torch.bfloat16, False)):
        with torch.device("meta"):
            net = DecoderModel(TINY_CONFIG).to(dtype)
        weights = linear_weights(net.to_empty(device="cpu"))
        assert weights and all(is_column_major(w) == column and w.dtype == dtype for w in weights)


def test_a_cast_changes_the_layout_and_keeps_the_values() -> None:
    layer = Linear(6, 4)
    before = layer.weight.detach().clone()
    assert is_column_major(layer.weight)
    layer.to(torch.bfloat16)
    assert layer.weight.is_contiguous() and torch.equal(layer.weight, before.bfloat16())
    layer.float()
    assert is_column_major(layer.weight) and torch.equal(layer.weight, before.bfloat16().float())


def test_copy_into_a_column_major_weight_keeps_layout_and_values() -> None:
    layer = Linear(6, 4, bias=False)
    source = torch.randn(4, 6)
    with torch.no_grad():
        layer.weight.copy_(source)
    assert is_column_major(layer.weight) and torch.equal(layer.weight, source)
    assert torch.equal(layer.state_dict()["weight"], source)
    x = torch.randn(1, 6)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, source), rtol=1e-6, atol=1e-6)
