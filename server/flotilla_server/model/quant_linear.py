"""QuantizedLinear and QuantizedEmbedding: a projection and a token embedding whose weights stay in the GGUF
blocks they were read in (model/quant_blocks.py), for `--quantization gguf`; Int8Linear and Int8Embedding:
the same with per-channel symmetric int8 weights and float32 scales (model/int8_weights.py), for
`--quantization int8`.

Why: a decode step at batch 1 reads every weight once, so its speed is the bytes it reads; and a shared
pool holds models in a memory budget, so its size is the bytes each model holds. A Q4_1 weight is 5 bits, its
float32 copy 32 (plus oneDNN's packed copy of it: 64).

Rules:
- the blocks are the file's bytes, rows reordered only where the runtime's layout needs it (llama.cpp's
  permuted Q and K rows); activations and accumulators are float32, whatever `--dtype` the rest computes in;
- a fused projection (Q/K/V, gate/up) is its parts' blocks stacked: one product per run of parts of one
  type, so parts may hold different types (Q4_K_M files give V a wider type than Q and K);
- an embedding lookup dequantizes only the rows it reads; a tied head multiplies by the same blocks, so the
  model holds one copy of the vocabulary's weights;
- no packed or float copy is kept: `weight_bytes` is what the module holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from .int8_weights import dequantize_int8_rows, int8_matmul, quantize_int8
from .quant_blocks import MANY_ROWS, dequantize_rows, few_rows_product, quant_matmul


def _merged(parts: Sequence[tuple[torch.Tensor, int]]) -> list[tuple[torch.Tensor, int]]:
    runs: list[tuple[list[torch.Tensor], int]] = []
    for blocks, qtype in parts:
        if runs and runs[-1][1] == int(qtype):
            runs[-1][0].append(blocks)
        else:
            runs.append(([blocks], int(qtype)))
    return [(blocks[0] if len(blocks) == 1 else torch.cat(blocks), qtype) for blocks, qtype in runs]


class QuantizedLinear(nn.Module):
    def __init__(self, in_features: int, parts: Sequence[tuple[torch.Tensor, int]], bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        """`parts`: (uint8 blocks [rows, bytes per row], GGML type id), in output order. Neighbouring parts of
        one type are held as one (their rows stacked): a step then makes one product and no concatenation."""
        super().__init__()
        self.in_features = in_features
        parts = _merged(parts)
        self.qtypes = tuple(int(qtype) for _, qtype in parts)
        for i, (blocks, _) in enumerate(parts):
            self.register_buffer(f"blocks{i}", blocks.contiguous(), persistent=False)
        self.out_features = sum(blocks.shape[0] for blocks, _ in parts)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)
        self._direct = self._direct_part()

    def parts(self) -> list[tuple[torch.Tensor, int]]:
        return [(getattr(self, f"blocks{i}"), qtype) for i, qtype in enumerate(self.qtypes)]

    def _direct_part(self) -> tuple[Callable | None, torch.Tensor, int] | None:
        """(native op or None, blocks, type) where the whole product is one quant_matmul of float32 rows (one
        part, no bias); the op is quant_blocks.few_rows_product's, for CPU blocks."""
        if len(self.qtypes) != 1 or self.bias is not None:
            return None
        blocks, qtype = self.blocks0, self.qtypes[0]
        return (few_rows_product(qtype) if blocks.is_cpu else None), blocks, qtype

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        self._direct = self._direct_part()  # the buffers may be new tensors (.to(device))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Rule: a decode step's float32 rows go straight to the product (a step makes ~120 of these calls,
        # and the general path below costs ~4 us more each in Python)
        if self._direct is not None and x.dtype == torch.float32 and x.dim() == 2:
            product, blocks, qtype = self._direct
            if product is not None and x.shape[0] < MANY_ROWS and x.is_cpu:
                return product(x, blocks, qtype)
            return quant_matmul(x, blocks, qtype)
        rows = x.reshape(-1, self.in_features).float()
        outs = [quant_matmul(rows, blocks, qtype) for blocks, qtype in self.parts()]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        held = sum(blocks.numel() for blocks, _ in self.parts())
        return held + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, types={self.qtypes}"


class QuantizedEmbedding(nn.Module):
    def __init__(self, blocks: torch.Tensor, qtype: int, embedding_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("blocks", blocks.contiguous(), persistent=False)
        self.qtype = int(qtype)
        self.num_embeddings, self.embedding_dim = blocks.shape[0], embedding_dim
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.blocks.index_select(0, ids.reshape(-1)), self.qtype, self.dtype).reshape(
            *ids.shape, self.embedding_dim)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied head: hidden [N, dim] times the vocabulary's blocks, float32 [N, vocab]."""
        return quant_matmul(hidden.float(), self.blocks, self.qtype)

    def weight_bytes(self) -> int:
        return self.blocks.numel()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, type={self.qtype}"


class Int8Linear(nn.Module):
    """A projection held as int8 [out, in] and float32 scales [out], one per output row (a fused projection's
    rows are its parts' rows, so quantizing it whole is quantizing each part); the bias stays in `dtype`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        w, scales = quantize_int8(weight)
        self.register_buffer("int8_weight", w, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.out_features, self.in_features = w.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None and x.dtype == torch.float32 and x.dim() == 2:  # as QuantizedLinear's rule
            return int8_matmul(x, self.int8_weight, self.scales)
        y = int8_matmul(x.reshape(-1, self.in_features).float(), self.int8_weight, self.scales)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


class Int8Embedding(nn.Module):
    """A token embedding held as int8 rows and a float32 scale per row: a lookup decodes only its rows; a tied
    head multiplies by the same rows, so the vocabulary is held once."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        w, scales = quantize_int8(weight)
        self.register_buffer("int8_weight", w, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.num_embeddings, self.embedding_dim = w.shape
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        rows = dequantize_int8_rows(self.int8_weight.index_select(0, flat), self.scales.index_select(0, flat),
                                    self.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied head: hidden [N, dim] times the vocabulary's int8 rows, float32 [N, vocab]."""
        return int8_matmul(hidden.float(), self.int8_weight, self.scales)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per row"
