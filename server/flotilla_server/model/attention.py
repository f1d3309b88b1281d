"""Paged attention: queries of one step attend to keys read from the KV pool through block tables.

A step carries prefill chunks and decode rows of many sequences in one flat token dimension. The
step's layout (slot of each new token, block indices to gather, masks) is computed once in
`AttentionBatch.build` and shared by every layer, so a layer only does tensor work:

- decode rows (one query each) are batched: one padded block gather + one
  `scaled_dot_product_attention` for all of them, with the grouped query heads folded into the
  query-length dimension (all heads of a group read the same keys);
- prefill chunks run one SDPA each; a chunk shorter than its keys uses a lower-right-aligned causal
  mask (query i sits at position `context_len - query_len + i` and sees keys up to there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kv_tensors import KVCacheTensors


@dataclass(frozen=True)
class PrefillChunk:
    token_start: int  # rows [token_start, token_end) of the step's flat token dimension
    token_end: int
    context_len: int  # keys to attend: all tokens in the KV after this step's writes
    block_ids: torch.Tensor | None  # [ceil(context_len / block_size)]; None: keys are the chunk's own
    mask: torch.Tensor | None  # [query_len, context_len] bool, True = attend; None: plain causal


@dataclass(frozen=True)
class DecodeRows:
    token_start: int  # the decode rows are the step's last `num_seqs` tokens
    num_seqs: int
    block_ids: torch.Tensor  # [num_seqs * max_blocks], each row padded with block 0
    max_blocks: int
    mask: torch.Tensor  # [num_seqs, 1, 1, max_blocks * block_size] bool, True = attend


@dataclass(frozen=True)
class AttentionBatch:
    slot_mapping: torch.Tensor  # [T] pool slot of each new token
    block_size: int
    prefills: tuple[PrefillChunk, ...]
    decode: DecodeRows | None
    num_tokens: int

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        context_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: str | torch.device,
    ) -> AttentionBatch:
        """Sequences in step order (prefill chunks first, then decodes). `query_lens[i]`: new tokens of
        sequence i this step; `context_lens[i]`: tokens in its KV after this step's writes;
        `block_tables[i]`: its block ids, covering at least `context_lens[i]` positions."""
        if not (len(query_lens) == len(context_lens) == len(block_tables)) or not query_lens:
            raise ValueError("query_lens, context_lens and block_tables must be non-empty and equally long")
        for q, c, table in zip(query_lens, context_lens, block_tables, strict=True):
            if not 1 <= q <= c or len(table) * block_size < c:
                raise ValueError(
                    f"bad sequence in step: query_len={q}, context_len={c}, {len(table)} blocks of "
                    f"{block_size}; need 1 <= query_len <= context_len <= blocks * block_size"
                )
        # decode rows: the trailing run of single-token queries (a 1-token prefill tail is the same math)
        num_decode = 0
        while num_decode < len(query_lens) and query_lens[len(query_lens) - 1 - num_decode] == 1:
            num_decode += 1
        num_prefill = len(query_lens) - num_decode

        slots: list[torch.Tensor | list[int]] = []
        prefills = []
        token_start = 0
        for i in range(num_prefill):
            q, c, table = query_lens[i], context_lens[i], block_tables[i]
            n_blocks = -(-c // block_size)
            table_t = torch.tensor(table[:n_blocks], dtype=torch.long)
            pos = torch.arange(c - q, c)
            slots.append(table_t[pos // block_size] * block_size + pos % block_size)
            if q == c:
                chunk = PrefillChunk(token_start, token_start + q, c, None, None)
            else:
                q_pos = torch.arange(c - q, c).unsqueeze(1)
                mask = torch.arange(c).unsqueeze(0) <= q_pos
                chunk = PrefillChunk(token_start, token_start + q, c, table_t.to(device), mask.to(device))
            prefills.append(chunk)
            token_start += q

        decode = None
        if num_decode:
            d_ctx = context_lens[num_prefill:]
            d_tables = block_tables[num_prefill:]
            max_blocks = -(-max(d_ctx) // block_size)
            padded: list[int] = []
            decode_slots = []
            for c, table in zip(d_ctx, d_tables, strict=True):
                n_blocks = -(-c // block_size)
                padded.extend(table[:n_blocks])
                padded.extend([0] * (max_blocks - n_blocks))
                decode_slots.append(table[(c - 1) // block_size] * block_size + (c - 1) % block_size)
            slots.append(decode_slots)
            ctx = torch.tensor(d_ctx, dtype=torch.long)
            mask = torch.arange(max_blocks * block_size).unsqueeze(0) < ctx.unsqueeze(1)
            decode = DecodeRows(
                token_start=token_start,
                num_seqs=num_decode,
                block_ids=torch.tensor(padded, dtype=torch.long, device=device),
                max_blocks=max_blocks,
                mask=mask.view(num_decode, 1, 1, -1).to(device),
            )
            token_start += num_decode

        slot_mapping = torch.cat([torch.as_tensor(s, dtype=torch.long) for s in slots]).to(device)
        return cls(slot_mapping, block_size, tuple(prefills), decode, token_start)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: KVCacheTensors,
    layer: int,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """q: [T, heads, head_dim]; k, v: this step's new rows [T, kv_heads, head_dim], already written to
    layer `layer` of `kv`. Returns [T, heads, head_dim]."""
    _, num_heads, head_dim = q.shape
    kv_heads = kv.k[layer].shape[1]
    group = num_heads // kv_heads
    if not batch.prefills and batch.decode is not None:
        return _decode(q, kv, layer, batch.decode, group, scale)

    out = torch.empty_like(q)
    for p in batch.prefills:
        qs = q[p.token_start:p.token_end].transpose(0, 1)  # [heads, L, d]
        if p.block_ids is None:
            ks = k[p.token_start:p.token_end].transpose(0, 1)
            vs = v[p.token_start:p.token_end].transpose(0, 1)
        else:
            k_rows, v_rows = kv.gather_blocks(layer, p.block_ids)
            ks = k_rows.view(-1, kv_heads, head_dim)[:p.context_len].transpose(0, 1)
            vs = v_rows.view(-1, kv_heads, head_dim)[:p.context_len].transpose(0, 1)
        if group > 1:  # expanded, not enable_gqa: on CPU enable_gqa falls back to the slow math kernel
            ks, vs = ks.repeat_interleave(group, dim=0), vs.repeat_interleave(group, dim=0)
        # 4-d (batch of one): the CPU flash kernel takes only 4-d inputs, 3-d ones go to the math kernel
        o = F.scaled_dot_product_attention(
            qs[None], ks[None], vs[None], attn_mask=p.mask, is_causal=p.mask is None, scale=scale
        )
        out[p.token_start:p.token_end] = o[0].transpose(0, 1)
    if batch.decode is not None:
        d = batch.decode
        out[d.token_start:] = _decode(q[d.token_start:], kv, layer, d, group, scale)
    return out


def _decode(
    q: torch.Tensor, kv: KVCacheTensors, layer: int, d: DecodeRows, group: int, scale: float
) -> torch.Tensor:
    """q: [D, heads, head_dim], one query per sequence. Returns [D, heads, head_dim]."""
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = num_heads // group
    # heads h = kv * group + g share kv head `kv`: fold g into the query-length dimension
    qg = q.view(num_seqs, kv_heads, group, head_dim)
    k_rows, v_rows = kv.gather_blocks(layer, d.block_ids)
    ks = k_rows.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    vs = v_rows.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    o = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=d.mask, scale=scale)
    return o.reshape(num_seqs, num_heads, head_dim)
