"""The model runner (mechanism): a StepPlan becomes tensors, one forward pass, sampled tokens.

It owns the model, the KV tensors, the per-sequence sampling generators and the grammar masks' filler
(engine/grammar_mask.py: constrained rows' masks are filled while the forward pass runs, then added to their
logits before sampling); it makes no decision.
A seeded sequence's generator lives from its first sample to `release` (finish or abort, both applied
between steps), so none outlives its request; choice `index` of a request seeded s draws from seed s + index,
as vLLM seeds its choices, so the choices differ and each is reproducible. Unseeded requests share one
generator seeded at random per process unless a seed is given: fresh replicas do not emit the same "random"
text. A leader's sampling row is sampled once more for each choice forking from it (scheduler.py, "n"), and
the rows that ask get their raw logprobs (logprobs.py).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace

import torch

from flotilla_server.engine.adapter_cache import AdapterCache
from flotilla_server.engine.decode_graphs import DecodeGraphs
from flotilla_server.engine.grammar_mask import MaskFiller
from flotilla_server.engine.logprobs import token_logprobs
from flotilla_server.engine.outputs import TokenLogprobs
from flotilla_server.engine.sampling import make_generator, sample
from flotilla_server.engine.step_plan import StepPlan
from flotilla_server.engine.step_threads import SmallStepThreads
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors
from flotilla_server.model.linear import pack_one_row
from flotilla_server.model.lora_linear import BASE_SLOT


@dataclass(frozen=True)
class StepResult:
    sampled_token_ids: list[int]  # one per row of `plan.sampled_seqs()`
    forward_s: float
    logprobs: list[TokenLogprobs | None]  # one per sampled token; None where its request did not ask
    prepare_s: float = 0.0  # the plan made into input tensors and the attention layout
    sample_s: float = 0.0  # sampling and logprobs
    num_threads: int = 0  # CPU threads the step ran on (engine/step_threads.py); 0 on a GPU
    num_constrained: int = 0  # rows sampled through a grammar's mask (engine/grammar_mask.py)
    mask_s: float = 0.0  # the masks' fill, on its thread during the forward pass
    mask_wait_s: float = 0.0  # what the step waited for the fill after the forward pass


class ModelRunner:
    def __init__(self, model: DecoderModel, kv: KVCacheTensors, device: str | torch.device,
                 seed: int | None = None, small_step_threads: int = 0, graphs: DecodeGraphs | None = None,
                 adapters: AdapterCache | None = None) -> None:
        self.model = model
        self.kv = kv
        self.device = torch.device(device)
        self.graphs = graphs  # captured decode steps (engine/decode_graphs.py); None: every step eager
        self.adapters = adapters  # LoRA slots: each step's rows are given their sequence's slot; None: no adapters
        # None: every step on the thread's own count (CUDA, or the rule off)
        self._threads = (SmallStepThreads(torch.get_num_threads(), small_step_threads)
                         if self.device.type == "cpu" and small_step_threads else None)
        if self._threads is not None and self._threads.wide > self._threads.own:
            pack_one_row(model)  # one-row steps split over threads, with the same bits on any count
        self._default_generator = make_generator(secrets.randbits(63) if seed is None else seed, self.device)
        self._generators: dict[tuple[str, int], torch.Generator] = {}  # seeded sequences only, by Sequence.key
        self.grammar_vocab_size = 0  # the masks' width, set with the engine's first grammar (EngineCore)
        self._masks: MaskFiller | None = None

    def close(self) -> None:
        if self._masks is not None:
            self._masks.close()

    def release(self, key: tuple[str, int]) -> None:
        self._generators.pop(key, None)

    @property
    def num_generators(self) -> int:
        """Seeded requests holding a generator (tests: none outlives its request)."""
        return len(self._generators)

    def _generator(self, key: tuple[str, int], seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        g = self._generators.get(key)
        if g is None:
            g = self._generators[key] = make_generator((seed + key[1]) % 2**63, self.device)
        return g

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step, on the threads engine/step_threads.py chooses for it, and report its time back.
        The thread's count is restored after a step that changed it, so that it stays the engine's own
        between steps (another runner on this thread, a model loaded later in multi-model mode, reads it
        as such)."""
        if self._threads is None:
            result = self._execute(plan)
            return replace(result, num_threads=torch.get_num_threads()) if self.device.type == "cpu" else result
        own = torch.get_num_threads()
        if own != self._threads.own:
            self._threads = SmallStepThreads(own, self._threads.wide)
        rows = plan.num_tokens
        want = self._threads.choose(rows)
        start = time.perf_counter()
        if want == own:
            result = self._execute(plan)
        else:
            torch.set_num_threads(want)
            try:
                result = self._execute(plan)
            finally:
                torch.set_num_threads(own)
        self._threads.observe(rows, want, time.perf_counter() - start)
        return replace(result, num_threads=want)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                 row_slots: list[int]) -> torch.Tensor:
        """The model over the step's rows, each row through its adapter's slot; the slots' rows are cleared
        after, so that no later forward pass (a timer's, a graph's capture) reads this step's."""
        if self.adapters is None or all(s == BASE_SLOT for s in row_slots):
            return self.model(ids, positions, batch, self.kv)
        self.adapters.slots.set_rows(torch.tensor(row_slots, dtype=torch.long, device=self.device))
        try:
            return self.model(ids, positions, batch, self.kv)
        finally:
            self.adapters.slots.set_rows(None)

    @torch.inference_mode()
    def _execute(self, plan: StepPlan) -> StepResult:
        prepare_start = time.perf_counter()
        input_ids: list[int] = []
        positions: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []  # per row of plan.sampled_seqs(): its position in the batch
        row_slots: list[int] = []  # per token row, in the step's flat order: its adapter's slot (adapters only)
        for c in plan.chunks:
            seq = c.seq
            if self.adapters is not None:
                row_slots += [self.adapters.slot_of(seq.params.lora)] * c.num_tokens
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
                sample_rows += [len(input_ids) - 1] * (1 + len(c.forks))
        seqs = plan.sampled_seqs()
        constrained = [i for i, s in enumerate(seqs) if s.matcher is not None]
        masks = None
        if constrained:  # filled on the filler's thread while the forward pass runs
            if self._masks is None:
                self._masks = MaskFiller(self.grammar_vocab_size)
            masks = self._masks.start([seqs[i].matcher for i in constrained])
        rows_t = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
        graphed = None
        if self.graphs is not None and sample_rows:  # a pure decode step may replay its captured graph
            start = time.perf_counter()
            graphed = self.graphs.run(query_lens, context_lens, input_ids, positions, tables)
        if graphed is not None:
            logits = graphed.index_select(0, rows_t)
        else:
            batch = AttentionBatch.build(query_lens, context_lens, tables, self.kv.block_size, self.device)
            ids_t = torch.tensor(input_ids, dtype=torch.long, device=self.device)
            pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
            start = time.perf_counter()
            hidden = self._forward(ids_t, pos_t, batch, row_slots)
            logits = self.model.compute_logits(hidden.index_select(0, rows_t)) if sample_rows else None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        forward_s = time.perf_counter() - start
        prepare_s = start - prepare_start
        if logits is None:
            return StepResult([], forward_s, [], prepare_s)

        mask_s = mask_wait_s = 0.0
        raw_logits = logits
        if masks is not None and self._masks is not None:
            waited = time.perf_counter()
            bitmask, mask_s = masks.result()
            mask_wait_s = time.perf_counter() - waited
            if any(seqs[i].params.logprobs is not None for i in constrained):
                raw_logits = logits.clone()  # logprobs stay the model's own, as without a grammar
            self._masks.apply(logits, torch.tensor(constrained, dtype=torch.long, device=self.device), bitmask)
        params = [s.params for s in seqs]
        generators = [self._generator(s.key, s.params.seed) for s in seqs]
        histories = None
        if any(p.has_penalties for p in params):
            histories = [(s.prompt_token_ids, s.output_token_ids) for s in seqs]
        tokens = sample(logits, params, generators, self._default_generator, histories)
        logprobs = token_logprobs(raw_logits, tokens, [p.logprobs for p in params])
        return StepResult(tokens, forward_s, logprobs, prepare_s, time.perf_counter() - start - forward_s,
                          num_constrained=len(constrained), mask_s=mask_s, mask_wait_s=mask_wait_s)
