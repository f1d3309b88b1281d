"""`--quantization fp8` (model/fp8_weights.py): e4m3 weights with per-channel scales, activations quantized per
token, through torch._scaled_mm. Served on GPUs of compute capability 8.9 and later only; here, on CPU, the
math is checked through torch's CPU _scaled_mm (the same operands and scales the GPU takes), the model's
wiring and footprint on `tiny`, and every refusal: CPU, shapes, and the CLI's one line (exit 2).

Bounds: e4m3 keeps 3 mantissa bits, so rounding a normal value moves it by at most 2**-4 of itself; values
below e4m3's smallest normal (2**-6, times the row's scale) move by at most half its subnormal step, 2**-10
times the scale. The product is written in bfloat16 (8 bits: 2**-8 of the result) after float32 sums.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model.fp8_weights import E4M3, E4M3_MAX, Fp8Linear, fp8_matmul, quantize_fp8
from flotilla_server.model.source import check_fp8, hf_config
from flotilla_server.model.tiny import TINY_CONFIG, build_tiny_model
from flotilla_server.model_cache.engine_processes import EngineProcesses
from flotilla_server.model_cache.footprint import fp8_weight_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.server.http.server_process import REPO
from tests.support.hf_models import make_hf_model_dir
from tests.support.ports import free_port


def e4m3_error_bound(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return values.abs() * 2**-4 + scales * 2**-10


@settings(max_examples=25, deadline=None)
@given(n=st.sampled_from([1, 16, 48]), k=st.sampled_from([16, 64, 160]), seed=st.integers(0, 2**31 - 1),
       spread=st.floats(1e-3, 1e3))
def test_weights_round_to_e4m3_within_its_bound_per_row(n, k, seed, spread):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g) * torch.logspace(0, 1, n)[:, None] * spread
    weight[0, :3] = 0.0
    w8, scales = quantize_fp8(weight)
    assert w8.dtype == E4M3 and scales.shape == (n,) and w8.float().abs().max() <= E4M3_MAX
    back = w8.float() * scales[:, None]
    assert torch.all((back - weight).abs() <= e4m3_error_bound(weight, scales[:, None]))
    zeros = quantize_fp8(torch.zeros(2, 16))
    assert torch.equal(zeros[1], torch.zeros(2)) and torch.equal(zeros[0].float(), torch.zeros(2, 16))


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_the_product_is_the_rounded_operands_product_in_bfloat16(rows):
    g = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 96, generator=g) * 3, torch.randn(48, 96, generator=g)
    w8, scales = quantize_fp8(weight)
    y = fp8_matmul(x, w8, scales)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, 48)
    x_scales = x.abs().amax(1, keepdim=True) / E4M3_MAX
    x8 = (x / x_scales).to(E4M3).float() * x_scales  # the activations as the GEMM sees them
    reference = x8 @ (w8.float() * scales[:, None]).T
    sums = x8.abs() @ (w8.float() * scales[:, None]).abs().T
    assert torch.all((y.float() - reference).abs() <= reference.abs() * 2**-8 + sums * 2**-20)
    exact = x @ weight.T  # and the whole rounding stays within e4m3's on both sides
    assert torch.all((y.float() - exact).abs() <= (x.abs() @ weight.abs().T) * (2 * 2**-4 + 2**-8) + 1e-3)


def test_a_linear_keeps_its_bias_in_the_model_dtype_and_returns_its_shape():
    weight, bias = torch.randn(32, 64), torch.randn(32)
    layer = Fp8Linear(weight, bias, torch.bfloat16)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 5, 32) and y.dtype == torch.bfloat16 and layer.bias.dtype == torch.bfloat16
    no_bias = Fp8Linear(weight, None, torch.bfloat16)(x)
    assert torch.allclose((y - no_bias).float(), bias.expand(2, 5, 32).to(torch.bfloat16).float(), atol=0.1)


def test_a_model_to_fp8_holds_its_footprint_and_agrees_with_bfloat16():
    net = build_tiny_model(torch.bfloat16, "cpu")
    reference = build_tiny_model(torch.bfloat16, "cpu")
    net.to_fp8()
    assert net.quantization() == "fp8"
    assert all(isinstance(m, Fp8Linear) for layer in net.layers
               for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj))
    assert not isinstance(net.embed_tokens, Fp8Linear)  # the embedding and the (tied) head stay in bfloat16
    # the CPU keeps a packed copy of the tied head's weight for bfloat16 where oneDNN has it; a GPU keeps none
    assert net.weight_bytes() == fp8_weight_bytes(TINY_CONFIG, "bfloat16") + net.packed_copy_bytes()
    from tests.server.model.test_int8_loading import logits  # one prefill, its logits

    ids = list(range(3, 40))
    fp8, bf16 = logits(net, ids).log_softmax(-1), logits(reference, ids).log_softmax(-1)
    kl = torch.nn.functional.kl_div(fp8, bf16, log_target=True, reduction="batchmean").item()
    assert kl <= 0.002, kl  # measured 0.0005 nats; the random tiny model's top tokens lie too close to count


def test_fp8_is_refused_on_cpu_and_for_shapes_fp8_products_cannot_take(tmp_path):
    with pytest.raises(ValueError, match=r"quantization fp8 runs on a GPU with fp8 tensor cores .*H100, H200\), not "
                                         r"on cpu: on CPU pass --quantization int8"):
        check_fp8(TINY_CONFIG, "cpu")
    check_fp8(TINY_CONFIG, "cuda")  # tiny's sizes are multiples of 16
    path = make_hf_model_dir("llama", tmp_path / "odd", intermediate_size=72)
    with pytest.raises(ValueError, match=r"quantization fp8 cannot take layer model\.layers\.0\.mlp\.down_proj of "
                                         r"shape \[64, 72\].*multiple of 16; pass --quantization none"):
        check_fp8(hf_config(path), "cuda")
    with pytest.raises(ValueError, match="quantization fp8 runs on a GPU"):  # the model cache, before loading
        EngineProcesses(EngineConfig(kv_cache_memory_bytes=2**20)).footprint_bytes("tiny", "fp8")


def test_the_cli_refuses_fp8_on_cpu_in_one_line():
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", "tiny", "--quantization", "fp8",
           "--port", str(free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "flotilla-server: error: --quantization fp8 runs on a GPU with fp8 tensor cores (compute capability 8.9 or "
        "later: L4, L40S, H100, H200), not on cpu: on CPU pass --quantization int8 (any model) or gguf (a .gguf file)"]
