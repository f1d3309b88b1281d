"""Paged attention: queries of one step attend to keys read from the KV pool through block tables.

A step carries prefill chunks and decode rows of many sequences in one flat token dimension. The
step's layout (slot of each new token, block indices to gather, masks) is computed once in
`AttentionBatch.build` and shared by every layer, so a layer only does tensor work:

- decode rows (one query each), float32 on CPU with the native kernels built: one op for all of them
  (`decode_ops.paged_decode_attention`, model/kernels/decode_attention.cpp), reading each row's keys and
  values in place through `decode_tables` and `decode_context_lens`: no gather copy, no mask. On the 2-core
  Xeon VM (family 6 model 167; SmolLM2's 9 heads of 64 on 3 kv heads, rows of mixed lengths) it took, against
  the grouped SDPA below, at 2 threads: batch 1 10 against 41 us (150 keys), 28 against 150 (1000); batch 16
  0.11 against 0.29 ms (150), 1.1 against 2.3 (1000); batch 64 0.32 against 0.86 ms (150), 6.5 against 9.8
  (1000); at 1 thread 1.5-3.6x. It was never slower, so it takes every decode row at every batch size;
- otherwise decode rows are batched: one padded block gather + one `scaled_dot_product_attention` per group
  of rows of similar length (`group_decode_rows`), with the grouped query heads folded into the query-length
  dimension (all heads of a group read the same keys);
- prefill chunks run one SDPA each; a chunk shorter than its keys uses a lower-right-aligned causal
  mask (query i sits at position `context_len - query_len + i` and sees keys up to there).

A sliding-window layer (Gemma 3's local layers: `window` > 0) sees only each query's `window` latest keys,
itself included. Every key stays in the pool (a sequence's blocks are shared by all its layers, and by the
prefix cache), so a window is a mask: built once per step and window, and only where some query's context
is longer than the window (below that the window cuts nothing, and the unmasked paths above run as they are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import decode_ops
from .kv_tensors import KVCacheTensors


@dataclass(frozen=True)
class PrefillChunk:
    token_start: int  # rows [token_start, token_end) of the step's flat token dimension
    token_end: int
    context_len: int  # keys to attend: all tokens in the KV after this step's writes
    block_ids: torch.Tensor | None  # [ceil(context_len / block_size)]; None: keys are the chunk's own
    mask: torch.Tensor | None  # [query_len, context_len] bool, True = attend; None: plain causal


@dataclass(frozen=True)
class DecodeGroup:
    rows: torch.Tensor | None  # this group's decode rows (0 = the first decode row); None: all, in order
    num_seqs: int
    block_ids: torch.Tensor  # [num_seqs * max_blocks], each row padded with block 0
    mask: torch.Tensor  # [num_seqs, 1, 1, max_blocks * block_size] bool, True = attend
    # one sequence (batch-1 decode): its keys are the first context_len gathered rows, and attention
    # runs on that slice with no mask (SDPA skips the mask's conversion and the masked tail)
    context_len: int | None = None


def group_decode_rows(block_counts: Sequence[int], rows_per_group: int = 8) -> list[list[int]]:
    """Decode rows (indices into `block_counts`), longest first, in groups of `rows_per_group` that each
    share one padded gather and one SDPA. A group pads only to its own longest row, and its gathered
    K/V stay small enough to be read back from cache. At batch 64 on 2 Xeon cores, groups of 8 made
    decode steps 1.1-1.5x faster than one group (tiny and a 100M Llama, contexts 16-1024)."""
    order = sorted(range(len(block_counts)), key=lambda i: -block_counts[i])
    return [order[i:i + rows_per_group] for i in range(0, len(order), rows_per_group)]


@dataclass(frozen=True)
class AttentionBatch:
    slot_mapping: torch.Tensor  # [T] pool slot of each new token
    block_size: int
    prefills: tuple[PrefillChunk, ...]
    decode_start: int  # decode rows are the step's tokens [decode_start, num_tokens)
    # the torch path's decode groups; None: built on first use (`groups()`) from `_decode_inputs`, so that a
    # step the native decode attention takes never builds them (at batch 64 they were a fifth of `prepare`)
    decode_groups: tuple[DecodeGroup, ...] | None
    num_tokens: int
    # for the native decode attention (CPU with the kernels built; None elsewhere): each decode row's block
    # table, padded with block 0 (int32 [D, max_blocks]), and its context length (int32 [D]), in step order
    decode_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    _decode_inputs: tuple | None = None  # (context lens, block tables, block counts, device) of the decode rows
    # window -> (the prefill chunks, the decode groups) with that sliding window's masks, and ("cut", window) ->
    # cut_by's answer, each built on first use
    _windowed: dict = field(default_factory=dict, compare=False)

    def groups(self) -> tuple[DecodeGroup, ...]:
        """The decode rows' groups for the torch path, built once."""
        if self.decode_groups is None:
            object.__setattr__(self, "decode_groups", _decode_groups(*self._decode_inputs, self.block_size)
                               if self._decode_inputs is not None else ())
        return self.decode_groups

    def cut_by(self, window: int) -> bool:
        """Whether a sliding window of `window` keys hides any key from this step's queries (a captured step's
        static groups: assumed so, their contexts are not known here). Asked by every windowed layer: answered once
        a step."""
        key = ("cut", window)
        if key not in self._windowed:
            contexts = [p.context_len for p in self.prefills]
            if self._decode_inputs is not None:
                contexts += self._decode_inputs[0]
            static = self._decode_inputs is None and bool(self.decode_groups)
            self._windowed[key] = static or any(c > window for c in contexts)
        return self._windowed[key]

    def windowed(self, window: int) -> tuple[tuple[PrefillChunk, ...], tuple[DecodeGroup, ...] | None]:
        """The prefill chunks and the decode groups as a layer with a sliding window of `window` keys sees them:
        a chunk or group whose contexts all fit in the window is returned as it is; decode groups are None
        where no decode row's context exceeds the window (the unwindowed decode paths then apply)."""
        if self._decode_inputs is None and self.decode_groups:
            # a captured decode step's static groups (engine/decode_graphs.py): their masks change between
            # replays, so the windowed ones are recomputed from them each time, by tensor ops a graph records
            return self.prefills, tuple(_windowed_group(g, window) for g in self.decode_groups)
        if window not in self._windowed:
            chunks = tuple(_windowed_chunk(p, window, self.slot_mapping.device) for p in self.prefills)
            d_ctx = self._decode_inputs[0] if self._decode_inputs is not None else []
            groups = None
            if any(c > window for c in d_ctx):
                groups = tuple(_windowed_group(g, window) for g in self.groups())
            self._windowed[window] = (chunks, groups)
        return self._windowed[window]

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

        decode_start = token_start
        decode_inputs = None
        tables_t = lens_t = None
        if num_decode:
            d_ctx = context_lens[num_prefill:]
            d_tables = block_tables[num_prefill:]
            slots.append([t[(c - 1) // block_size] * block_size + (c - 1) % block_size
                          for c, t in zip(d_ctx, d_tables, strict=True)])
            n_blocks = [-(-c // block_size) for c in d_ctx]
            if decode_ops.NATIVE and torch.device(device).type == "cpu":
                width = max(n_blocks)
                flat: list[int] = []  # one flat list: torch.tensor of nested lists took twice as long
                for table, n in zip(d_tables, n_blocks, strict=True):
                    flat.extend(table[:n])
                    flat.extend([0] * (width - n))
                tables_t = torch.tensor(flat, dtype=torch.int32).view(num_decode, width)
                lens_t = torch.tensor(d_ctx, dtype=torch.int32)
            decode_inputs = (list(d_ctx), list(d_tables), n_blocks, device)
            token_start += num_decode

        slot_mapping = torch.cat([torch.as_tensor(s, dtype=torch.long) for s in slots]).to(device)
        return cls(slot_mapping, block_size, tuple(prefills), decode_start, None, token_start, tables_t, lens_t,
                   decode_inputs)


def _decode_groups(d_ctx: list[int], d_tables: list[Sequence[int]], n_blocks: list[int],
                   device: str | torch.device, block_size: int) -> tuple[DecodeGroup, ...]:
    """The decode rows (step order) in groups of similar block counts, each with its padded block ids and mask."""
    num_decode = len(d_ctx)
    groups: list[DecodeGroup] = []
    # groups help CPU caches; on a GPU, extra kernel launches would cost more than padding
    on_cpu = torch.device(device).type == "cpu"
    grouping = group_decode_rows(n_blocks) if on_cpu else [list(range(num_decode))]
    if len(grouping) == 1:
        grouping = [list(range(num_decode))]  # one group keeps step order: no row shuffling
    for rows in grouping:
        max_blocks = n_blocks[rows[0]] if len(grouping) > 1 else max(n_blocks)
        padded: list[int] = []
        for i in rows:
            padded.extend(d_tables[i][:n_blocks[i]])
            padded.extend([0] * (max_blocks - n_blocks[i]))
        ctx = torch.tensor([d_ctx[i] for i in rows], dtype=torch.long)
        mask = torch.arange(max_blocks * block_size).unsqueeze(0) < ctx.unsqueeze(1)
        groups.append(DecodeGroup(
            rows=None if len(grouping) == 1 else torch.tensor(rows, dtype=torch.long, device=device),
            num_seqs=len(rows),
            block_ids=torch.tensor(padded, dtype=torch.long, device=device),
            mask=mask.view(len(rows), 1, 1, -1).to(device),
            context_len=d_ctx[rows[0]] if len(rows) == 1 else None,
        ))
    return tuple(groups)


def _windowed_chunk(p: PrefillChunk, window: int, device: torch.device) -> PrefillChunk:
    """Chunk `p` as a layer with a sliding window of `window` keys sees it: query at position i attends to keys
    (i - window, i] (transformers' sliding_window_overlay), so its mask is causal and banded."""
    if p.context_len <= window:
        return p
    q_pos = torch.arange(p.context_len - (p.token_end - p.token_start), p.context_len).unsqueeze(1)
    keys = torch.arange(p.context_len).unsqueeze(0)
    mask = (keys <= q_pos) & (keys > q_pos - window)
    return PrefillChunk(p.token_start, p.token_end, p.context_len, p.block_ids, mask.to(device))


def _windowed_group(g: DecodeGroup, window: int) -> DecodeGroup:
    """Decode group `g` with each row's keys limited to its `window` latest: the row's mask keeps positions
    [context_len - window, context_len)."""
    context_lens = g.mask.view(g.num_seqs, -1).sum(-1, keepdim=True)  # each row's mask is its first positions
    positions = torch.arange(g.mask.shape[-1], device=g.mask.device).unsqueeze(0)
    mask = g.mask & (positions >= context_lens - window).view(g.mask.shape)
    return DecodeGroup(g.rows, g.num_seqs, g.block_ids, mask, context_len=None)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: KVCacheTensors,
    layer: int,
    batch: AttentionBatch,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """q: [T, heads, head_dim]; k, v: this step's new rows [T, kv_heads, head_dim], already written to
    layer `layer` of `kv`; `window` > 0: each query sees only its `window` latest keys. Returns
    [T, heads, head_dim]."""
    _, num_heads, head_dim = q.shape
    kv_heads = kv.k[layer].shape[1]
    group = num_heads // kv_heads
    prefills, windowed_groups = batch.windowed(window) if window else (batch.prefills, None)
    if not prefills:
        return _decode_rows(q, kv, layer, batch, group, scale, windowed_groups)

    out = torch.empty_like(q)
    for p in prefills:
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
    if batch.decode_start < batch.num_tokens:
        out[batch.decode_start:] = _decode_rows(q[batch.decode_start:], kv, layer, batch, group, scale,
                                                windowed_groups)
    return out


def _decode_rows(
    q: torch.Tensor, kv: KVCacheTensors, layer: int, batch: AttentionBatch, group: int, scale: float,
    windowed_groups: tuple[DecodeGroup, ...] | None = None,
) -> torch.Tensor:
    """q: [D, heads, head_dim], the decode rows in step order; `windowed_groups`: the rows' groups with a
    sliding window's masks (AttentionBatch.windowed), where a window cuts some row's keys. Returns
    [D, heads, head_dim]."""
    heads_dense = q.stride(-1) == 1 and q.stride(1) == q.shape[2]  # the native op reads heads side by side
    if (windowed_groups is None and batch.decode_tables is not None and decode_ops.native_for(q)
            and heads_dense):
        return decode_ops.paged_decode_attention(q, kv.k[layer], kv.v[layer], batch.decode_tables,
                                                 batch.decode_context_lens, batch.block_size, scale)
    groups = batch.groups() if windowed_groups is None else windowed_groups
    if len(groups) == 1 and groups[0].rows is None:
        return _decode(q, kv, layer, groups[0], group, scale)
    out = torch.empty_like(q)
    for g in groups:
        out.index_copy_(0, g.rows, _decode(q.index_select(0, g.rows), kv, layer, g, group, scale))
    return out


def _decode(
    q: torch.Tensor, kv: KVCacheTensors, layer: int, d: DecodeGroup, group: int, scale: float
) -> torch.Tensor:
    """q: [n, heads, head_dim], one query per sequence of group `d`. Returns [n, heads, head_dim]."""
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = num_heads // group
    # heads h = kv * group + g share kv head `kv`: fold g into the query-length dimension
    qg = q.view(num_seqs, kv_heads, group, head_dim)
    k_rows, v_rows = kv.gather_blocks(layer, d.block_ids)
    ks = k_rows.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    vs = v_rows.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    if d.context_len is not None:
        ks, vs = ks[:, :, : d.context_len], vs[:, :, : d.context_len]
        o = F.scaled_dot_product_attention(qg, ks, vs, scale=scale)
    else:
        o = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=d.mask, scale=scale)
    return o.reshape(num_seqs, num_heads, head_dim)
