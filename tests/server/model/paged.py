"""A minimal greedy generation loop over the paged runtime, for tests of the model alone.

It allocates blocks itself (no scheduler): every step carries the prefill chunks of sequences that
still have prompt left (at most `chunk` tokens each), then one decode row per other running
sequence, all in one forward pass. `start_steps[i]` delays sequence i, so that prefills and decodes
of different sequences share steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors


@dataclass
class _Seq:
    tokens: list[int]
    num_prompt: int
    start_step: int
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)


def paged_greedy(
    model: DecoderModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    chunk: int = 10_000,
    start_steps: Sequence[int] | None = None,
    block_size: int = 16,
    num_blocks: int = 512,
) -> list[list[int]]:
    """Greedy continuations (max_new_tokens each, EOS ignored) of every prompt."""
    cfg = model.config
    w = model.norm.weight  # the compute dtype and device (the embedding may be quantized)
    kv = KVCacheTensors.allocate(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                                 w.dtype, w.device)
    free = list(range(num_blocks - 1, -1, -1))
    starts = start_steps or [0] * len(prompts)
    seqs = [_Seq(list(p), len(p), s) for p, s in zip(prompts, starts, strict=True)]
    step = 0
    while any(len(s.tokens) - s.num_prompt < max_new_tokens for s in seqs):
        active = [s for s in seqs if s.start_step <= step and len(s.tokens) - s.num_prompt < max_new_tokens]
        step += 1
        if not active:
            continue
        # prefill chunks first, then decode rows (the order the runtime expects)
        rows = [(s, min(chunk, len(s.tokens) - s.num_computed)) for s in active if len(s.tokens) - s.num_computed > 1]
        rows += [(s, 1) for s in active if len(s.tokens) - s.num_computed == 1]
        ids, positions = [], []
        for s, n in rows:
            while len(s.block_table) * block_size < s.num_computed + n:
                s.block_table.append(free.pop())
            ids += s.tokens[s.num_computed:s.num_computed + n]
            positions += range(s.num_computed, s.num_computed + n)
        batch = AttentionBatch.build(
            [n for _, n in rows], [s.num_computed + n for s, n in rows], [s.block_table for s, _ in rows],
            block_size, w.device,
        )
        with torch.inference_mode():
            hidden = model(torch.tensor(ids, device=w.device), torch.tensor(positions, device=w.device), batch, kv)
            last_rows = torch.tensor(_cumsum([n for _, n in rows]), device=w.device) - 1
            next_ids = model.compute_logits(hidden[last_rows]).argmax(-1).tolist()
        for (s, n), token in zip(rows, next_ids, strict=True):
            s.num_computed += n
            if s.num_computed == len(s.tokens):  # a whole prompt or a decode row: its last logits are new
                s.tokens.append(token)
    return [s.tokens[s.num_prompt:] for s in seqs]


def _cumsum(xs: list[int]) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out
