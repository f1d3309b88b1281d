"""Torch decoders of llama.cpp's GGUF blocks, one function per type, for model/quant_blocks.dequantize_rows.

Why apart from quant_blocks.py: that module is the products' mechanism (which path runs, tiles, the native
ops); this one is only the block layouts, each written in `gguf.quants.dequantize`'s order of float operations
so that float32 results have its bits (tests/server/model/test_gguf_types.py checks every type for them). Each
takes raw [rows, blocks, block bytes] uint8 and returns float32 [rows, blocks, ...] whose last dimensions
flatten to the block's weights in order.

Layouts (ggml-common.h; little-endian). Blocks of 32 weights:
  Q5_0, 22 bytes: fp16 d, uint32 qh, uint8 qs[16]; weight i < 16 is the low nibble of qs[i], weight 16 + i its
    high nibble, each with bit i (or 16 + i) of qh as its fifth bit, q in 0..31; w = d * (q - 16)
  Q5_1, 24 bytes: fp16 d, fp16 m, uint32 qh, uint8 qs[16]; q as Q5_0's; w = d * q + m
Super-blocks of 256 weights (so a row is a multiple of 256: llama.cpp gives a tensor with other rows another
type):
  Q2_K, 84 bytes: uint8 scales[16] (low nibble a sub-block's scale, high its min), uint8 qs[64], fp16 d, fp16
    dmin; 16 sub-blocks of 16; weight 128 h + 32 s + i has bits 2 s, 2 s + 1 of qs[32 h + i];
    w = (d * scale) * q - dmin * min
  Q3_K, 110 bytes: uint8 hmask[32], uint8 qs[64], uint8 scales[12], fp16 d; 16 sub-blocks of 16 with 6-bit
    scales (low 4 bits from nibbles of scales[0..7]: sub-block j < 8 the low one of byte j, j + 8 its high
    one; high 2 bits from bits 2 (j / 4) of scales[8 + j % 4]), less 32; weight 128 h + 32 s + i has 2 bits
    of q as Q2_K's, and bit b of hmask[i] for weight 32 b + i, which when clear subtracts 4;
    w = (d * scale) * q
  Q5_K, 176 bytes: fp16 d, fp16 dmin, uint8 scales[12] (Q4_K's packing), uint8 qh[32], uint8 qs[128]; 8
    sub-blocks of 32; weight 64 j + i (i < 32) is the low nibble of qs[32 j + i] with bit 2 j of qh[i] as its
    fifth, weight 64 j + 32 + i the high nibble with bit 2 j + 1; w = (d * sc) * q - dmin * m
Every product here is exact in float32 (an fp16 times integers of at most 6 + 5 bits), so each weight is
rounded at most once, at its sum or difference; an FMA gives the same bits (kernels/kquant_matmul.cpp).
"""

from __future__ import annotations

import torch


def halves(raw: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte `at` of each block of raw [rows, blocks, block bytes], as float32 [rows, blocks, 1]."""
    return raw[..., at:at + 2].contiguous().view(torch.float16).float()


def q4k_scales_and_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's (and Q5_K's) 12 packed bytes [..., 12] -> 8 six-bit scales and 8 mins, each uint8 [..., 8], as
    llama.cpp's get_scale_min_k4: for j < 4, scale j is the low 6 bits of byte j and min j of byte j + 4; for
    j >= 4 their low 4 bits are byte j + 4's low (scale) or high (min) nibble and their high 2 the top bits of
    byte j - 4 (scale) or j (min)."""
    d, m, both = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = torch.cat((d & 0x3F, (both & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mins = torch.cat((m & 0x3F, (both >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return scales, mins


def _bits(raw: torch.Tensor, count: int) -> torch.Tensor:
    """raw [..., bytes] -> [..., count, bytes]: bit b of every byte in row b (b < count)."""
    shifts = torch.arange(count, dtype=torch.uint8, device=raw.device).reshape(count, 1)
    return (raw.unsqueeze(-2) >> shifts) & 1


def _five_bit(raw: torch.Tensor, qh_at: int) -> torch.Tensor:
    """Q5_0's and Q5_1's 32 integers 0..31 of each block, uint8 [rows, blocks, 32]."""
    qs = raw[..., qh_at + 4:]
    low = torch.cat((qs & 0x0F, qs >> 4), dim=-1)
    high = _bits(raw[..., qh_at:qh_at + 4], 8).transpose(-1, -2).reshape(*raw.shape[:-1], 32)  # bit i of uint32 qh
    return low | (high << 4)


def q5_0(raw: torch.Tensor) -> torch.Tensor:
    return (_five_bit(raw, 2).float() - 16).mul_(halves(raw, 0))


def q5_1(raw: torch.Tensor) -> torch.Tensor:
    return _five_bit(raw, 4).float().mul_(halves(raw, 0)).add_(halves(raw, 2))


def _two_bit(qs: torch.Tensor) -> torch.Tensor:
    """64 bytes [..., 64] -> the 256 two-bit integers [..., 16, 16], in weight order."""
    lead = qs.shape[:-1]
    pairs = torch.stack([(qs.reshape(*lead, 2, 32) >> shift) & 3 for shift in (0, 2, 4, 6)], dim=-2)
    return pairs.reshape(*lead, 16, 16)


def q2_k(raw: torch.Tensor) -> torch.Tensor:
    scales = raw[..., :16]
    d_scales = (halves(raw, 80) * (scales & 0x0F).float()).unsqueeze(-1)  # [rows, blocks, 16, 1]
    d_mins = (halves(raw, 82) * (scales >> 4).float()).unsqueeze(-1)
    return _two_bit(raw[..., 16:80]).float().mul_(d_scales).sub_(d_mins)


def q3_k(raw: torch.Tensor) -> torch.Tensor:
    lead = raw.shape[:-1]
    packed = raw[..., 96:108]
    low = torch.cat((packed[..., :8] & 0x0F, packed[..., :8] >> 4), dim=-1)  # sub-blocks 0..7, 8..15
    high = torch.stack([(packed[..., 8:12] >> shift) & 3 for shift in (0, 2, 4, 6)], dim=-2).reshape(*lead, 16)
    scales = (low | (high << 4)).float().sub_(32)
    d_scales = (halves(raw, 108) * scales).unsqueeze(-1)  # [rows, blocks, 16, 1]
    hmask = _bits(raw[..., :32], 8).reshape(*lead, 16, 16)  # weight 32 b + i: bit b of hmask[i]
    q = _two_bit(raw[..., 32:96]).float().sub_((1 - hmask).float() * 4)
    return q.mul_(d_scales)


def q4_k(raw: torch.Tensor) -> torch.Tensor:
    """-> [rows, blocks, 8 sub-blocks, 32]: (d * sc) * nibble - dmin * m (the product exact, so only the
    subtraction rounds)."""
    scales, mins = q4k_scales_and_mins(raw[..., 4:16])
    d_scales = (halves(raw, 0) * scales.float()).unsqueeze(-1)  # [rows, blocks, 8, 1]
    d_mins = (halves(raw, 2) * mins.float()).unsqueeze(-1)
    qs = raw[..., 16:].reshape(*raw.shape[:-1], 4, 1, 32)  # 32 bytes: sub-blocks 2 j (low) and 2 j + 1 (high)
    nibbles = torch.cat((qs & 0x0F, qs >> 4), dim=-2).reshape(*raw.shape[:-1], 8, 32).float()
    return nibbles.mul_(d_scales).sub_(d_mins)


def q5_k(raw: torch.Tensor) -> torch.Tensor:
    lead = raw.shape[:-1]
    scales, mins = q4k_scales_and_mins(raw[..., 4:16])
    d_scales = (halves(raw, 0) * scales.float()).unsqueeze(-1)  # [rows, blocks, 8, 1]
    d_mins = (halves(raw, 2) * mins.float()).unsqueeze(-1)
    qs = raw[..., 48:].reshape(*lead, 4, 1, 32)
    nibbles = torch.cat((qs & 0x0F, qs >> 4), dim=-2).reshape(*lead, 8, 32)
    fifth = _bits(raw[..., 16:48], 8)  # [.., 8, 32]: sub-block s takes bit s of qh[i]
    return (nibbles | (fifth << 4)).float().mul_(d_scales).sub_(d_mins)


def q6_k(raw: torch.Tensor) -> torch.Tensor:
    """-> [rows, blocks, 16 sub-blocks, 16]: (d * scale) * (q - 32), the product exact."""
    lead = raw.shape[:-1]
    ql = raw[..., :128].reshape(*lead, 2, 1, 64)  # per half: s = 0, 1 from low nibbles, s = 2, 3 from high
    low = torch.cat((ql & 0x0F, ql >> 4), dim=-2).reshape(*lead, 2, 4, 32)
    qh = raw[..., 128:192].reshape(*lead, 2, 1, 32)
    high = torch.cat([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=-2)  # [.., 2, 4, 32]: s = 0..3
    q = (low | (high << 4)).reshape(*lead, 16, 16).float().sub_(32)
    d_scales = halves(raw, 208) * raw[..., 192:208].contiguous().view(torch.int8).float()  # [rows, blocks, 16]
    return q.mul_(d_scales.unsqueeze(-1))
