"""The model runner (mechanism): a StepPlan becomes tensors, one forward pass, sampled tokens.

It owns the model, the KV tensors, the per-sequence sampling generators and the grammar masks' filler
(engine/grammar_mask.py: constrained rows' masks are filled while the forward pass runs, then added to their
logits before sampling); it makes no decision.
A seeded sequence's generator lives from its first sample to `release` (finish or abort, both applied
between steps), so none outlives its request; choice `index` of a request seeded s draws from seed s + index,
as vLLM seeds its choices, so the choices differ and each is reproducible. Unseeded requests share one
generator seeded at random per process unless a seed is given: fresh replicas do not emit the same "random"
text. A leader's sampling row is sampled once more for each choice forking from it (scheduler.py, "n"), and
the rows that ask get their raw logprobs (logprobs.py). A drafted decode row (engine/speculative.py) feeds its
draft after its last token; each of its positions yields logits, and the draft is verified against them
(engine/speculative_verify.py), so one forward pass commits up to k + 1 tokens. Its k + 1 positions go to the
attention as k + 1 decode rows over the same block table, row j seeing the keys up to its own position (a layer
writes the step's keys before it attends): the decode kernel reads them in place, where a prefill chunk would
gather and mask them (measured on SmolLM2-135M at 600 keys: 8 rows 24 ms instead of 33, 2 rows 11 instead of 20).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace

import torch

from flotilla_server.engine.adapter_cache import AdapterCache
from flotilla_server.engine.decode_graphs import DecodeGraphs
from flotilla_server.engine.grammar_mask import MaskFiller
from flotilla_server.engine.logprobs import token_logprobs
from flotilla_server.engine.outputs import TokenLogprobs
from flotilla_server.engine.sampling import make_generator, sample
from flotilla_server.engine.speculative_verify import verify
from flotilla_server.engine.step_plan import ScheduledChunk, StepPlan
from flotilla_server.engine.step_threads import SmallStepThreads
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors
from flotilla_server.model.linear import pack_one_row
from flotilla_server.model.lora_linear import BASE_SLOT


@dataclass(frozen=True)
class StepResult:
    sampled_token_ids: list[int]  # one per row of `plan.sampled_seqs()`: a drafted row's, after its accepted tokens
    forward_s: float
    # per row of `plan.sampled_seqs()`, one per token it commits (accepted draft tokens, then the sampled one);
    # None where its request did not ask
    logprobs: list[list[TokenLogprobs] | None]
    prepare_s: float = 0.0  # the plan made into input tensors and the attention layout
    sample_s: float = 0.0  # sampling and logprobs
    num_threads: int = 0  # CPU threads the step ran on (engine/step_threads.py); 0 on a GPU
    num_constrained: int = 0  # rows sampled through a grammar's mask (engine/grammar_mask.py)
    mask_s: float = 0.0  # the masks' fill, on its thread during the forward pass
    mask_wait_s: float = 0.0  # what the step waited for the fill after the forward pass
    num_accepted: list[int] = field(default_factory=list)  # per chunk of `plan.drafted()`: draft tokens accepted


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
        self._draft_threads = None if self._threads is None else SmallStepThreads(self._threads.own, self._threads.wide)
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
        as such). A step of decodes only, some with drafts, counts its sequences rather than its rows, on a rule
        measured apart: one to SMALL_STEP_MAX_ROWS sequences serve as many streams, whatever their drafts."""
        if self._threads is None or self._draft_threads is None:
            result = self._execute(plan)
            return replace(result, num_threads=torch.get_num_threads()) if self.device.type == "cpu" else result
        own = torch.get_num_threads()
        if own != self._threads.own:
            self._threads = SmallStepThreads(own, self._threads.wide)
            self._draft_threads = SmallStepThreads(own, self._threads.wide)
        rule = self._threads
        rows = plan.num_tokens
        if plan.num_draft_tokens and not plan.num_prefill_tokens:
            rule, rows = self._draft_threads, plan.num_decode_seqs
        want = rule.choose(rows)
        start = time.perf_counter()
        if want == own:
            result = self._execute(plan)
        else:
            torch.set_num_threads(want)
            try:
                result = self._execute(plan)
            finally:
                torch.set_num_threads(own)
        rule.observe(rows, want, time.perf_counter() - start)
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
        sample_rows: list[int] = []  # per undrafted row of plan.sampled_seqs(): its position in the batch
        draft_rows: list[int] = []  # every position of every drafted chunk, in plan order
        row_slots: list[int] = []  # per token row, in the step's flat order: its adapter's slot (adapters only)
        for c in plan.chunks:
            seq = c.seq
            if self.adapters is not None:
                row_slots += [self.adapters.slot_of(seq.params.lora)] * c.num_tokens
            end = c.context_len
            if c.draft_token_ids:
                for j, token in enumerate([*seq.token_slice(c.start, c.start + 1), *c.draft_token_ids]):
                    input_ids.append(token)
                    positions.append(c.start + j)
                    query_lens.append(1)
                    context_lens.append(c.start + j + 1)
                    tables.append(seq.block_table)
                draft_rows += range(len(input_ids) - c.num_tokens, len(input_ids))
                continue
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
        seqs = [s for c in plan.chunks if c.sample and not c.draft_token_ids for s in (c.seq, *c.forks)]
        constrained = [i for i, s in enumerate(seqs) if s.matcher is not None]
        masks = None
        if constrained:  # filled on the filler's thread while the forward pass runs
            if self._masks is None:
                self._masks = MaskFiller(self.grammar_vocab_size)
            masks = self._masks.start([seqs[i].matcher for i in constrained])
        rows_t = torch.tensor(sample_rows + draft_rows, dtype=torch.long, device=self.device)
        graphed = None
        if self.graphs is not None and sample_rows and not draft_rows:  # a pure decode step may replay its captured graph
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
            logits = self.model.compute_logits(hidden.index_select(0, rows_t)) if len(rows_t) else None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        forward_s = time.perf_counter() - start
        prepare_s = start - prepare_start
        if logits is None:
            return StepResult([], forward_s, [], prepare_s)

        logits, draft_logits = logits[:len(sample_rows)], logits[len(sample_rows):]
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
        tokens = sample(logits, params, generators, self._default_generator, histories) if seqs else []
        logprobs = token_logprobs(raw_logits, tokens, [p.logprobs for p in params])
        verified = [self._verify(c, draft_logits[i:i + c.num_tokens])
                    for c, i in zip(plan.drafted(), _starts(plan.drafted()), strict=True)]
        all_tokens, all_logprobs = _in_plan_order(plan, tokens, logprobs, verified)
        return StepResult(all_tokens, forward_s, all_logprobs, prepare_s, time.perf_counter() - start - forward_s,
                          num_constrained=len(constrained), mask_s=mask_s, mask_wait_s=mask_wait_s,
                          num_accepted=[m for m, _, _ in verified])

    def _verify(self, chunk: ScheduledChunk, logits: torch.Tensor) -> tuple[int, int, list[TokenLogprobs] | None]:
        """A drafted chunk's (accepted draft tokens, next token, logprobs of the tokens it commits)."""
        seq, draft = chunk.seq, chunk.draft_token_ids
        assert seq.matcher is None, "a constrained sequence never drafts"
        generator = self._generator(seq.key, seq.params.seed) or self._default_generator
        m, token = verify(logits, draft, seq.params, (seq.prompt_token_ids, seq.output_token_ids), generator)
        committed = [*draft[:m], token]
        lps = token_logprobs(logits[:m + 1], committed, [seq.params.logprobs] * (m + 1))
        return m, token, None if seq.params.logprobs is None else [lp for lp in lps if lp is not None]


def _starts(chunks: list[ScheduledChunk]) -> list[int]:
    """Each drafted chunk's first row among the drafted logits rows."""
    out, at = [], 0
    for c in chunks:
        out.append(at)
        at += c.num_tokens
    return out


def _in_plan_order(plan: StepPlan, tokens: list[int], logprobs: list[TokenLogprobs | None],
                   verified: list[tuple[int, int, list[TokenLogprobs] | None]]
                   ) -> tuple[list[int], list[list[TokenLogprobs] | None]]:
    """Undrafted rows' samples and drafted rows' verdicts, merged in the order of `plan.sampled_seqs()`."""
    plain, drafted = iter(zip(tokens, logprobs, strict=True)), iter(verified)
    out_tokens: list[int] = []
    out_logprobs: list[list[TokenLogprobs] | None] = []
    for c in plan.chunks:
        if c.draft_token_ids:
            _, token, lps = next(drafted)
            out_tokens.append(token)
            out_logprobs.append(lps)
            continue
        for _ in (c.seq, *c.forks) if c.sample else ():
            token, lp = next(plain)
            out_tokens.append(token)
            out_logprobs.append(None if lp is None else [lp])
    return out_tokens, out_logprobs
