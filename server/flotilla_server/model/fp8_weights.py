"""`--quantization fp8` on a GPU: every projection held as float8 e4m3 weights with a float32 scale per output
row, multiplied by `torch._scaled_mm`, which takes fp8 on both sides: each activation row is quantized to e4m3
at run time with its own scale (per token), and the product is scaled by both in the GEMM's epilogue.

Why: a decode step reads every weight once, so 1 byte per weight reads half of bfloat16's; and the GPUs that
have fp8 tensor cores (compute capability 8.9 and later: L4, L40S, H100, H200) multiply e4m3 at twice
bfloat16's rate. Weight-only int8 on CUDA goes through aten::_weight_int8pack_mm, whose CUDA kernel is one
thread per output element reading float activations: no tensor cores, so `int8` stays a CPU mode.

Rules:
- scale = max|row| / 448 (e4m3's largest finite value), w = row / scale rounded to e4m3 (torch's cast:
  nearest, saturating at 448 by construction); a row of zeros has scale 0 (its products are 0);
- activations: scale = max|x row| / 448 per token (a row of zeros takes scale 1: its products are 0 anyway);
- the output is bfloat16 from `_scaled_mm` (its row-wise scaling writes bfloat16 only), then the model dtype;
  a bias is added after, in the model dtype;
- the token embedding, the head and the norms stay in `--dtype`: the embedding is a lookup, and the head's
  rounding moves every logit (on SmolLM2 the int8 head alone flipped 2 % of top-1 tokens);
- both sides' inner size must be a multiple of 16 and the output size too (`_scaled_mm`'s rule):
  source.check_fp8 refuses other shapes before any weight is read.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
FP8_SHAPE_MULTIPLE = 16


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [n, k] (any float dtype) -> (e4m3 [n, k] row-major, float32 scales [n]) on its device."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1) / E4M3_MAX
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))
    return (w / divisor[:, None]).to(E4M3).contiguous(), scales.contiguous()


def fp8_matmul(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [m, k] @ (w [n, k] e4m3 * scales[:, None]).T -> [m, n] bfloat16: x quantized per row to e4m3."""
    x32 = x.float()
    x_scales = x32.abs().amax(dim=1, keepdim=True) / E4M3_MAX
    x_scales = torch.where(x_scales > 0, x_scales, torch.ones_like(x_scales))
    x8 = (x32 / x_scales).to(E4M3)
    return torch._scaled_mm(x8, w.t(), scale_a=x_scales, scale_b=scales[None, :], out_dtype=torch.bfloat16)


def fp8_probe(device: str) -> None:
    """One 16 x 16 product on `device`: raises RuntimeError where it cannot run fp8 with row-wise scales."""
    w, scales = quantize_fp8(torch.ones(16, 16, device=device))
    fp8_matmul(torch.ones(16, 16, device=device), w, scales)


class Fp8Linear(nn.Module):
    """A projection held as e4m3 [out, in] and float32 scales [out] (a fused projection's rows are its parts',
    so quantizing it whole is quantizing each part); the bias stays in `dtype`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        w, scales = quantize_fp8(weight)
        self.register_buffer("fp8_weight", w, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.out_features, self.in_features = w.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = fp8_matmul(x.reshape(-1, self.in_features), self.fp8_weight, self.scales).to(x.dtype)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 per channel"
