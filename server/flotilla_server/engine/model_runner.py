"""The model runner (mechanism): a StepPlan becomes tensors, one forward pass, sampled tokens.

It owns the model, the KV tensors and the per-request sampling generators; it makes no decision.
A seeded request's generator lives from its first sample to `release` (finish or abort, both applied
between steps), so none outlives its request. Unseeded requests share one generator seeded at random per
process unless a seed is given: fresh replicas do not emit the same "random" text.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

import torch

from flotilla_server.engine.sampling import make_generator, sample
from flotilla_server.engine.scheduler import StepPlan
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors


@dataclass(frozen=True)
class StepResult:
    sampled_token_ids: list[int]  # one per chunk with `sample`, in plan order
    forward_s: float


class ModelRunner:
    def __init__(self, model: DecoderModel, kv: KVCacheTensors, device: str | torch.device,
                 seed: int | None = None) -> None:
        self.model = model
        self.kv = kv
        self.device = torch.device(device)
        self._default_generator = make_generator(secrets.randbits(63) if seed is None else seed, self.device)
        self._generators: dict[str, torch.Generator] = {}  # seeded requests only

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    @property
    def num_generators(self) -> int:
        """Seeded requests holding a generator (tests: none outlives its request)."""
        return len(self._generators)

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        g = self._generators.get(request_id)
        if g is None:
            g = self._generators[request_id] = make_generator(seed, self.device)
        return g

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        input_ids: list[int] = []
        positions: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        for c in plan.chunks:
            seq = c.seq
            end = c.context_len
            if c.num_tokens == 1:
                input_ids.append(seq.token_slice(c.start, end)[0])
                positions.append(c.start)
            else:
                input_ids.extend(seq.token_slice(c.start, end))
                positions.extend(range(c.start, end))
            query_lens.append(c.num_tokens)
            context_lens.append(end)
            tables.append(seq.block_table)
            if c.sample:
                sample_rows.append(len(input_ids) - 1)
        batch = AttentionBatch.build(query_lens, context_lens, tables, self.kv.block_size, self.device)
        ids_t = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        rows_t = torch.tensor(sample_rows, dtype=torch.long, device=self.device)

        start = time.perf_counter()
        hidden = self.model(ids_t, pos_t, batch, self.kv)
        logits = self.model.compute_logits(hidden.index_select(0, rows_t)) if sample_rows else None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        forward_s = time.perf_counter() - start
        if logits is None:
            return StepResult([], forward_s)

        sampled_chunks = [c for c in plan.chunks if c.sample]
        params = [c.seq.params for c in sampled_chunks]
        generators = [self._generator(c.seq.request_id, c.seq.params.seed) for c in sampled_chunks]
        histories = None
        if any(p.has_penalties for p in params):
            histories = [(c.seq.prompt_token_ids, c.seq.output_token_ids) for c in sampled_chunks]
        tokens = sample(logits, params, generators, self._default_generator, histories)
        return StepResult(tokens, forward_s)
