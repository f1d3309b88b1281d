"""Captured decode steps: one graph per padded shape (engine/graph_shapes.py decides which), replayed on
static input buffers that each step fills.

A graph replays the kernels it recorded on the addresses it recorded, so everything a step reads or
writes lives at a fixed address:

- per shape (rows R, blocks B): token ids, positions, KV slots [R], gathered block ids [R * B] and the
  attention mask [R, 1, 1, B * block_size]; padding rows take token 0 at position 0, write their K/V to
  the scratch block (one block past the pool's, never handed out) and attend to that one slot, so they
  touch no sequence's KV and their softmax stays finite; a real row's blocks past its own are the scratch
  block too, masked out;
- the gathered K/V go to a buffer of `gather_budget_tokens` tokens allocated once, before the first
  capture (KVCacheTensors.sharing), never to the eager path's buffer, which grows and moves; the engine
  allocates it before it sizes the KV pool from free GPU memory, so the pool leaves room for it;
- the logits of all R rows come out of the graph; the runner takes the sampled rows from them.

The backend captures: `CudaGraphBackend` with `torch.cuda.graph` (warm-up on a side stream first, all
graphs in one memory pool); `EagerBackend` replays by running the same function on the same buffers, the
whole mechanism but the capture, for machines without a GPU (the CPU tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from flotilla_server.engine.graph_shapes import GraphShapes
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors
from flotilla_server.model.attention import DecodeGroup

Step = Callable[[], torch.Tensor]


class GraphBackend(Protocol):
    def capture(self, step: Step) -> Step:
        """Record `step` (its buffers already hold a real step's inputs); returns what replays it."""
        ...


class EagerBackend:
    def capture(self, step: Step) -> Step:
        return step


class CudaGraphBackend:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Step) -> Step:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, workspaces) stays out of the graph
                step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


@dataclass
class _Static:
    input_ids: torch.Tensor
    positions: torch.Tensor
    batch: AttentionBatch
    replay: Step | None = None

    @property
    def slots(self) -> torch.Tensor:
        return self.batch.slot_mapping

    @property
    def group(self) -> DecodeGroup:
        return self.batch.groups()[0]


class DecodeGraphs:
    def __init__(self, model: DecoderModel, kv: KVCacheTensors, shapes: GraphShapes, scratch_block: int,
                 backend: GraphBackend, gather: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """`gather`: buffers from `KVCacheTensors.gather_buffers` for `shapes.gather_budget_tokens` tokens
        (the engine allocates them before it sizes the pool); None: allocated here."""
        if not 0 <= scratch_block < kv.num_blocks:
            raise ValueError(f"scratch block {scratch_block} is not a block of the KV tensors ({kv.num_blocks})")
        self.model, self.shapes, self.backend = model, shapes, backend
        self.device = kv.k[0].device
        self.scratch_block = scratch_block
        k = kv.k[0]
        if gather is None:
            gather = KVCacheTensors.gather_buffers(shapes.gather_budget_tokens, k.shape[1], k.shape[2], k.dtype,
                                                   k.device)
        if gather[0].numel() < shapes.gather_budget_tokens * k.shape[1] * k.shape[2]:
            raise ValueError("gather buffers smaller than the shapes' gather budget")
        self._kv = kv.sharing(gather)
        self._graphs: dict[tuple[int, int], _Static] = {}
        self.replays = 0

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def run(self, query_lens: Sequence[int], context_lens: Sequence[int], input_ids: Sequence[int],
            positions: Sequence[int], tables: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """Float32 logits [len(input_ids), vocab] of a pure decode step from its graph, or None when the
        step runs eagerly. The rows are valid until the next call."""
        shape = self.shapes.shape_for(query_lens, context_lens)
        if shape is None:
            return None
        static = self._graphs.get(shape)
        if static is None:
            if not self.shapes.may_capture(self.captured):
                return None
            static = self._graphs[shape] = self._buffers(*shape)
        self._fill(static, context_lens, input_ids, positions, tables)
        if static.replay is None:  # captured on the buffers of a real step: its warm-up runs write real K/V
            static.replay = self.backend.capture(self._step(static))
        self.replays += 1
        return static.replay()[: len(input_ids)]

    def _buffers(self, rows: int, blocks: int) -> _Static:
        bs, dev = self._kv.block_size, self.device
        group = DecodeGroup(
            rows=None, num_seqs=rows, block_ids=torch.zeros(rows * blocks, dtype=torch.long, device=dev),
            mask=torch.zeros(rows, 1, 1, blocks * bs, dtype=torch.bool, device=dev), context_len=None,
        )
        batch = AttentionBatch(slot_mapping=torch.zeros(rows, dtype=torch.long, device=dev), block_size=bs,
                               prefills=(), decode_start=0, decode_groups=(group,), num_tokens=rows)
        return _Static(torch.zeros(rows, dtype=torch.long, device=dev), torch.zeros(rows, dtype=torch.long, device=dev),
                       batch)

    def _step(self, static: _Static) -> Step:
        model, kv = self.model, self._kv

        def step() -> torch.Tensor:
            return model.compute_logits(model(static.input_ids, static.positions, static.batch, kv))

        return step

    def _fill(self, static: _Static, context_lens: Sequence[int], input_ids: Sequence[int],
              positions: Sequence[int], tables: Sequence[Sequence[int]]) -> None:
        rows, bs = static.input_ids.shape[0], self._kv.block_size
        blocks = static.group.block_ids.shape[0] // rows
        pad = rows - len(input_ids)
        scratch = self.scratch_block
        slots, block_ids = [], []
        for c, table in zip(context_lens, tables, strict=True):
            slots.append(table[(c - 1) // bs] * bs + (c - 1) % bs)
            own = table[: -(-c // bs)]
            block_ids += [*own, *[scratch] * (blocks - len(own))]
        block_ids += [scratch] * (blocks * pad)
        ctx = torch.tensor([*context_lens, *[1] * pad])
        with torch.inference_mode():
            static.input_ids.copy_(torch.tensor([*input_ids, *[0] * pad]), non_blocking=True)
            static.positions.copy_(torch.tensor([*positions, *[0] * pad]), non_blocking=True)
            static.slots.copy_(torch.tensor([*slots, *[scratch * bs] * pad]), non_blocking=True)
            static.group.block_ids.copy_(torch.tensor(block_ids), non_blocking=True)
            mask = torch.arange(blocks * bs).unsqueeze(0) < ctx.unsqueeze(1)
            static.group.mask.copy_(mask.view(rows, 1, 1, -1), non_blocking=True)
