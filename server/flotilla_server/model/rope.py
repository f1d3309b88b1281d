"""Rotary position embeddings, including Llama 3's frequency scaling and Phi-3's LongRoPE.

cos/sin are computed per step for the step's positions, in float32 with the same operations as
transformers (bit-identical values), then cast to the model dtype. Per step this costs a few small
ops, and no table bounds the positions or takes memory for a 128K context. They span the rotary
dims only (`ModelConfig.rotary_dim`: fewer than head_dim with Phi's partial rotary).

LongRoPE's rule, per token by position: a token at position p rotates by the short factors while
p < original_max_position_embeddings, by the long ones from there on. Every sequence of at most that
many tokens (prompt and output) is thus rotated as transformers rotates it: all short. A longer one is not:
transformers rotates all of its tokens by the long factors (a prompt past the length in its prefill; one that
grows past it in `generate`, which then drops its cache and recomputes the whole sequence), where here its
first original_max_position_embeddings positions keep the short rotation. Why by position: cos/sin then
depend on the position alone, so a cached block's keys stay valid for any request that shares them (prefix
caching), a token's rotation does not depend on the batch it lands in, and nothing is recomputed.
"""

from __future__ import annotations

import math

import torch

from .config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None, long: bool = False) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies (`head_dim`: the dims rotated, ModelConfig.rotary_dim). For
    longrope, the short factors' set, or with `long` the long factors'."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if scaling is not None and scaling.rope_type == "longrope":  # transformers' order of operations: same bits
        factors = scaling.long_factor if long else scaling.short_factor
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta ** exponents)
    inv_freq = 1.0 / (theta ** exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "rope_freqs":  # as llama.cpp applies a GGUF's rope_freqs tensor
        return inv_freq / torch.tensor(scaling.freq_divisors, dtype=torch.float32)
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [T, head_dim] in `dtype`, for positions [T]."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def longrope_cos_sin(positions: torch.Tensor, short_inv_freq: torch.Tensor, long_inv_freq: torch.Tensor,
                     scaling: RopeScaling, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """As rope_cos_sin, each position by its own set of frequencies (the module's rule: long from
    original_max_position_embeddings on), both scaled by the attention factor."""
    is_long = (positions >= scaling.original_max_position_embeddings)[:, None]
    inv_freq = torch.where(is_long, long_inv_freq[None, :], short_inv_freq[None, :])
    freqs = positions.float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling.attention_factor).to(dtype), (emb.sin() * scaling.attention_factor).to(dtype)
