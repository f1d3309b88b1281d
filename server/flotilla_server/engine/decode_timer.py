"""One decode step of the served model on a chosen number of CPU threads, timed (mechanism for
engine/thread_count.py, which decides from the times).

The step is what a loaded server runs: `rows` sequences, each bringing one token at `context_len` tokens of
context, then the logits of every row. Every row reads the same first blocks of the KV pool and writes its
token into the same slot, so the step needs no more of the pool than one short sequence. It runs before
any request is admitted: the blocks it writes are free, and a request's tokens are written into its blocks
before they are read.
"""

from __future__ import annotations

import time

import torch

from flotilla_server.engine.feasibility import blocks_for
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors

CONTEXT_TOKENS = 128  # a short conversation's context: the matrices, not attention, set the step's time


class DecodeStepTimer:
    def __init__(self, model: DecoderModel, kv: KVCacheTensors, rows: int, context_len: int) -> None:
        device = kv.k[0].device
        table = list(range(blocks_for(context_len, kv.block_size)))
        self._model, self._kv = model, kv
        self._batch = AttentionBatch.build([1] * rows, [context_len] * rows, [table] * rows, kv.block_size, device)
        self._ids = torch.zeros(rows, dtype=torch.long, device=device)
        self._positions = torch.full((rows,), context_len - 1, dtype=torch.long, device=device)

    @torch.inference_mode()
    def __call__(self, threads: int) -> float:
        """Seconds of one step on `threads` threads; the calling thread's count stays `threads`."""
        torch.set_num_threads(threads)
        start = time.perf_counter()
        hidden = self._model(self._ids, self._positions, self._batch, self._kv)
        self._model.compute_logits(hidden)
        return time.perf_counter() - start
