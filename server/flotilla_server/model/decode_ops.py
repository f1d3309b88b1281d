"""The native float32 CPU ops around a decode step's matmuls (model/kernels/decode_ops.cpp and
decode_attention.cpp), each with the torch code it replaces as its fallback.

Why: at batch 1 a layer's norms, RoPE, KV write, attention and activation are ops on a few hundred to a few
thousand floats, so torch's per-op dispatch and allocation outweigh their arithmetic. On this project's
2-core Xeon VM (family 6 model 167, 2 threads), SmolLM2-135M spent 205 of a layer's 347 us outside its four
matmuls that way (docs/architecture.md, model/llama.py).

- `NATIVE`: every op loaded (model/native_gemv.py's library, built from a source that has them);
  `native_for(x)`: they may run on x, a float32 CPU tensor with grad disabled (they have no autograd);
- `native`: the ops themselves (torch.ops.flotilla.*, None where NATIVE is false), for a caller that checked
  `native_for` once for many calls (model/llama.py's layer loop): each check costs about 0.2 us;
- `rms_norm`, `add_rms_norm`, `silu_mul`, `rope_kv_write`, `paged_decode_attention`: the ops; each runs the
  native kernel when `native_for` its input, else its torch fallback (the same math up to float rounding;
  `rope_kv_write`'s rotation has torch's bits on either path). `native.decode_attention` is rope_kv_write and
  paged_decode_attention in one call, for a decode step (model/llama.py; no fallback of its own: the caller
  runs the two). `rotate_half` is the torch rotation (model/llama.py's other dtypes, Qwen3's QK norm and Phi's
  partial rotary).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .native_gemv import native_op

_OPS = ("rms_norm", "add_rms_norm", "silu_mul", "rope_kv_write", "paged_decode_attention", "decode_attention")
NATIVE = all(native_op(name) is not None for name in _OPS)
native: Any = torch.ops.flotilla if NATIVE else None


def native_for(x: torch.Tensor) -> bool:
    """The native ops may run on x (and its step's other tensors): float32 on CPU, grad disabled."""
    return NATIVE and x.dtype == torch.float32 and x.is_cpu and not torch.is_grad_enabled()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps) * weight, for contiguous float32 rows."""
    if native_for(x) and x.is_contiguous():
        return native.rms_norm(x, weight, eps)
    return F.rms_norm(x, weight.shape, weight, eps)


def add_rms_norm(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """h += x in place (a residual add), then rms_norm(h)."""
    if native_for(h) and h.is_contiguous() and x.is_contiguous():
        return native.add_rms_norm(h, x, weight, eps)
    h.add_(x)
    return F.rms_norm(h, weight.shape, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for rows [..., 2 * inter] that hold gate, then up."""
    if native_for(gate_up) and gate_up.is_contiguous():
        return native.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, over x's last dimension (heads of d); where cos and sin are narrower
    (partial rotary), over its first cos.shape[-1] dims, the rest passed through (transformers' Phi-3)."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((rotate_half(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope_kv_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_pool: torch.Tensor,
                  v_pool: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int) -> None:
    """qkv [T, (heads + 2 kv_heads) * d], a fused projection's output: rotates its q and k heads in place by
    cos, sin ([T, d] or [T, 1, d]) and writes each token's k and v heads to row slots[t] of the pools."""
    if native_for(qkv) and qkv.stride(-1) == 1 and slots.dtype == torch.long:
        native.rope_kv_write(qkv, cos, sin, k_pool, v_pool, slots, heads, kv_heads)
        return
    tokens, d = qkv.shape[0], cos.shape[-1]
    qk = qkv[:, : (heads + kv_heads) * d].view(tokens, heads + kv_heads, d)
    qk.copy_(rotate_half(qk, cos.view(tokens, 1, d), sin.view(tokens, 1, d)))
    k_pool.index_copy_(0, slots, qk[:, heads:])
    v_pool.index_copy_(0, slots, qkv[:, (heads + kv_heads) * d:].view(tokens, kv_heads, d))


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """q [n, heads, d]: one query per sequence; row i attends to the first context_lens[i] keys of the pools
    ([slots, kv_heads, d]) through block_tables[i] (int32 [n, max_blocks]). Returns [n, heads, d]. The
    fallback gathers each row's keys and runs scaled_dot_product_attention on them."""
    if native_for(q) and q.stride(-1) == 1 and q.stride(1) == q.shape[-1]:
        return native.paged_decode_attention(q, k_pool, v_pool, block_tables, context_lens, block_size, scale)
    n, heads, d = q.shape
    group = heads // k_pool.shape[1]
    out = torch.empty(n, heads, d, dtype=q.dtype, device=q.device)
    for i, (table, length) in enumerate(zip(block_tables.tolist(), context_lens.tolist(), strict=True)):
        slots = torch.arange(length) % block_size + torch.tensor(table)[torch.arange(length) // block_size] * block_size
        keys = k_pool[slots.to(q.device)].transpose(0, 1).repeat_interleave(group, 0)
        values = v_pool[slots.to(q.device)].transpose(0, 1).repeat_interleave(group, 0)
        out[i] = F.scaled_dot_product_attention(q[i, :, None], keys, values, scale=scale)[:, 0]
    return out
