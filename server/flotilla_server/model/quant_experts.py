"""QuantizedExperts: a mixture-of-experts block's experts held in the GGUF blocks they were read in
(`--quantization gguf`), in place of moe.Experts' float stacks.

Why: experts are most of an MoE model's bytes (all of them resident, a few read per token), so they are the
weights whose blocks matter most; dequantized to float32, a Q4_K_M file's experts would take 5 to 7 times the
memory.

Rules:
- llama.cpp stores a layer's experts as 3-D tensors, `ffn_gate_exps` and `ffn_up_exps` [E, I, H] and
  `ffn_down_exps` [E, H, I]; as blocks they are uint8 [E, rows, bytes per row], and expert e's matrix is the
  2-D slice [e], contiguous, which model/quant_blocks.py's products take as they take a projection's blocks;
- gate and up of one type are stacked as one [E, 2 x I, bytes] buffer (gate rows first, as moe.Experts'), so an
  expert's gate/up is one product, as a dense layer's fused gate_up_proj is; of two types they stay apart;
- activations are float32 (the block products'), cast back to the rows' dtype: the same rule as
  quant_linear.QuantizedLinear;
- `weight_bytes` is what the module holds: the blocks, no float or packed copy.
"""

from __future__ import annotations

import torch
from torch import nn

from . import decode_ops
from .quant_blocks import quant_matmul


class QuantizedExperts(nn.Module):
    def __init__(self, gate: tuple[torch.Tensor, int], up: tuple[torch.Tensor, int],
                 down: tuple[torch.Tensor, int]) -> None:
        """Each part: (uint8 blocks [E, rows, bytes per row], GGML type id)."""
        super().__init__()
        (gate_blocks, gate_type), (up_blocks, up_type), (down_blocks, down_type) = gate, up, down
        if int(gate_type) == int(up_type):
            parts = [(torch.cat((gate_blocks, up_blocks), dim=1), int(gate_type))]
        else:
            parts = [(gate_blocks, int(gate_type)), (up_blocks, int(up_type))]
        self.gate_up_types = tuple(qtype for _, qtype in parts)
        for i, (blocks, _) in enumerate(parts):
            self.register_buffer(f"gate_up{i}", blocks.contiguous(), persistent=False)
        self.register_buffer("down", down_blocks.contiguous(), persistent=False)
        self.down_type = int(down_type)
        self.num_experts = down_blocks.shape[0]

    @property
    def qtypes(self) -> tuple[int, ...]:
        return (*self.gate_up_types, self.down_type)

    def run(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """Expert `expert`'s SwiGLU over its rows [n, H]: [n, H] in the rows' dtype."""
        x = rows.float()
        products = [quant_matmul(x, getattr(self, f"gate_up{i}")[expert], qtype)
                    for i, qtype in enumerate(self.gate_up_types)]
        gate_up = products[0] if len(products) == 1 else torch.cat(products, dim=-1)
        return quant_matmul(decode_ops.silu_mul(gate_up), self.down[expert], self.down_type).to(rows.dtype)

    def weight_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers())

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, types={self.qtypes}"
