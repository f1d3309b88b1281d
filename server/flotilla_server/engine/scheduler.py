"""Scheduling policy: who is admitted, what each step computes, whom to preempt.

The scheduler never touches a tensor. Each step it returns a `StepPlan`; the model runner carries
it out and hands the sampled tokens back to `update`. Rules (docs/architecture.md, "Design rules: scheduler"):

- Admission, FIFO by ticket: a free slot, plus free blocks for the whole prompt and a reserve
  (the reserve is checked, never allocated). Blocks promised to prefills already admitted count
  as taken.
- A step: prefill chunks first (each at most `prefill_chunk`), then one decode row per running
  sequence, all under `max_num_batched_tokens`; decode rows are budgeted before prefills.
- Prefix caching: an admitted sequence first takes the longest run of cached full blocks of its tokens
  (always leaving its last token to compute, which yields the logits to sample) and prefills only the
  rest; each block it fills completely is registered in the cache. Queries and hits are counted in
  tokens, as vLLM does.
- n: the choices of one prompt are admitted together and hold n slots. Only the first (the leader)
  prefills; its first sampled row is sampled once per choice, and each other choice then forks from it:
  it shares the leader's full prompt blocks (ref_count + 1) and computes only the prompt's partial last
  block and its own first token. A request's other prompts wait in the queue behind its first.
- Blocks are taken on demand. When the pool is dry, the most recently admitted sequence of the least
  urgent class is preempted by recompute and goes back to the queue in ticket order. Sequences are
  served oldest first, so the oldest always progresses: no deadlock.
- Classes (engine/class_rules.py): batch work never takes the interactive reserve of slots, gives its slot
  to an interactive arrival (a bounded number of times), takes little prefill while interactive work waits,
  and sits out the decode of a step that prefills interactive work (never two steps in a row). Preempted
  batch sequences never hold back interactive arrivals.
- LoRA adapters: a sequence is admitted only once its adapter holds a slot (`adapter_gate`, the core's
  engine/adapter_residency.py rule), after the slot and block checks pass (a load is not wasted on a sequence
  that would not fit). One waiting for an adapter slot ("no_adapter_slot") holds back nobody behind it: the
  slot frees only when the sequences pinning it finish, and those may be behind it.
- Speculation (engine/speculative.py): a decode row may carry a draft. A draft takes only the step's budget
  left and blocks already free: it never preempts anyone. Its accepted tokens are committed, the blocks that
  held only rejected ones go back to the pool, and a block is registered in the prefix cache only once every
  token in it is committed (rejected tokens never enter a hash).
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Collection

from flotilla_contract.classes import REQUEST_CLASSES

from flotilla_server.engine.block_hash import extend_hashes
from flotilla_server.engine.class_rules import ClassRules, lean_step_skips, pool_victim, slot_victim
from flotilla_server.engine.feasibility import infeasible_reason  # noqa: F401 (the scheduler's rule, re-exported)
from flotilla_server.engine.kv_pool import BlockPool
from flotilla_server.engine.prefix_keys import PrefixKeyIndex
from flotilla_server.engine.sequence import Sequence, SequenceStatus
from flotilla_server.engine.speculative import Speculator, propose
from flotilla_server.engine.step_plan import ScheduledChunk, StepPlan
from flotilla_server.engine.stopping import token_finish_reason

DEFERRAL_REASONS = ("no_slot", "no_blocks")
NO_ADAPTER_SLOT = "no_adapter_slot"  # every adapter slot is pinned (counted once it happens)


class Scheduler:
    def __init__(
        self,
        pool: BlockPool,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefill_chunk: int,
        eos_token_ids: Collection[int] = (),
        reserve_blocks: int | None = None,
        rules: ClassRules | None = None,
        adapter_gate: Callable[[Sequence], bool] | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs so every decode fits a step")
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk = prefill_chunk
        self.eos_token_ids = frozenset(eos_token_ids)
        # watermark kept free for running sequences' growth, as vLLM does (1% of the pool)
        self.reserve_blocks = max(1, pool.num_blocks // 100) if reserve_blocks is None else reserve_blocks
        self.waiting: deque[Sequence] = deque()  # ticket order; preempted sequences sit at the head
        self.running: list[Sequence] = []  # admission order; the last is the next victim
        self.preemptions = 0
        self.prefix_cache_queries = 0  # tokens of sequences admitted while caching is on
        self.prefix_cache_hits = 0  # of those, tokens found in the cache
        self.deferrals: Counter[str] = Counter({r: 0 for r in DEFERRAL_REASONS})
        self.prefix_keys = PrefixKeyIndex()
        self.rules = rules or ClassRules()
        self.interactive_waiting = False  # set by the engine loop: interactive requests wait in its queue
        self.preemptions_by_class: Counter[str] = Counter({c: 0 for c in REQUEST_CLASSES})
        self._lean_last_step = False  # the last step left batch decode rows out
        self._tickets = itertools.count()
        self._by_id: dict[str, list[Sequence]] = {}  # a request's unfinished sequences, forks included
        # True when the sequence's adapter holds a slot now (loading it if it may); None: no adapters served
        self.adapter_gate = adapter_gate
        self.speculator = speculator  # None: no decode row ever carries a draft

    # --- arrivals -------------------------------------------------------------------------------

    def add(self, seq: Sequence, rest: Collection[Sequence] = ()) -> None:
        """Queue a new request (its first prompt's leader, and those of its other prompts); `schedule`
        admits each when it fits."""
        self._register([seq, *rest])
        self.waiting.extend([seq, *rest])

    @property
    def num_slots_used(self) -> int:
        """Running sequences and the choices waiting to fork from them."""
        return sum(s.num_seqs for s in self.running)

    def admission_block(self, num_tokens: int, num_shared_blocks: int = 0, num_seqs: int = 1) -> str | None:
        """Why a sequence of `num_tokens` with `num_seqs` - 1 forks cannot be admitted now ("no_slot",
        "no_blocks"), or None.

        `num_shared_blocks`: cached blocks of its prefix that other sequences hold (they cost no free block).
        """
        if self.num_slots_used + num_seqs > self.max_num_seqs:
            return "no_slot"
        reserve = self.reserve_blocks if self.running else 0  # alone, a sequence needs no reserve
        available = self.pool.num_free_blocks - self._promised_blocks()
        # each fork takes one block of its own at once: the prompt's partial last block, or its first token's
        needed = self.pool.blocks_for(num_tokens) - num_shared_blocks + (num_seqs - 1)
        if needed + reserve > available:
            return "no_blocks"
        return None

    def _admission_block_for(self, seq: Sequence) -> str | None:
        if not self.rules.fits_class_slots(seq, self.running, self.max_num_seqs):
            return "no_slot"
        hit = self._cache_hit(seq)
        reason = self.admission_block(seq.num_tokens, len(hit) - self.pool.num_free_in(hit), seq.num_seqs)
        if reason is None and seq.params.lora is not None and self.adapter_gate is not None \
                and not self.adapter_gate(seq):
            return NO_ADAPTER_SLOT
        return reason

    def _cache_hit(self, seq: Sequence) -> list[int]:
        """The cached blocks `seq` would start from: full blocks only, and never its last token."""
        if not self.pool.enable_caching:
            return []
        bs = self.pool.block_size
        limit = (seq.num_tokens - 1) // bs
        if len(seq.block_hashes) < limit:
            extend_hashes(seq.block_hashes, seq.token_slice(0, limit * bs), bs, seq.params.cache_salt, seq.params.lora)
        return self.pool.match_prefix(seq.block_hashes[:limit])

    def try_admit(self, seq: Sequence, rest: Collection[Sequence] = ()) -> str | None:
        """Admit a new request at once if its first leader fits (the HTTP path), queueing the leaders of its
        other prompts (`rest`); else count and return why not."""
        if any(not (w.params.is_batch and not seq.params.is_batch) for w in self.waiting):
            # preempted sequences of its class, or of a more urgent one, go first: it never overtakes them
            full = self.num_slots_used + seq.num_seqs > self.max_num_seqs
            reason = "no_slot" if full or not self.rules.fits_class_slots(seq, self.running, self.max_num_seqs) \
                else "no_blocks"
        else:
            reason = self._admission_block_for(seq)
            while reason == "no_slot" and not seq.params.is_batch and (victim := slot_victim(self.running, self.rules)):
                self._preempt(victim)  # an interactive arrival takes the newest batch sequence's slot
                reason = self._admission_block_for(seq)
        if reason is not None:
            self.deferrals[reason] += 1
            return reason
        self._register([seq, *rest])
        self._start(seq)
        self.waiting.extend(rest)
        return None

    def _register(self, leaders: list[Sequence]) -> None:
        rid = leaders[0].request_id
        if rid in self._by_id:
            raise ValueError(f"request id {rid!r} is already in use")
        group: list[Sequence] = []
        for leader in leaders:
            leader.ticket = next(self._tickets)
            leader.status = SequenceStatus.WAITING
            for fork in leader.forks:
                fork.fork_of, fork.ticket, fork.status = leader, leader.ticket, SequenceStatus.WAITING
            group += [leader, *leader.forks]
        self._by_id[rid] = group

    def _start(self, seq: Sequence) -> None:
        if self.pool.enable_caching:
            hit = self.pool.take(self._cache_hit(seq))
            seq.block_table = hit
            seq.num_computed_tokens = seq.num_cached_tokens = len(hit) * self.pool.block_size
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += seq.num_cached_tokens
            if seq.params.prefix_key is not None:
                limit = (seq.num_tokens - 1) // self.pool.block_size  # the full blocks `_cache_hit` hashed
                self.prefix_keys.note(seq.params.prefix_key, seq.block_hashes[:limit])
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _register_full_blocks(self, seq: Sequence, start: int) -> None:
        """Offer the cache every block that became full and computed since position `start`."""
        bs = self.pool.block_size
        first, end = start // bs, seq.num_computed_tokens // bs
        if not self.pool.enable_caching or first >= end:
            return
        if len(seq.block_hashes) < end:
            extend_hashes(seq.block_hashes, seq.token_slice(0, end * bs), bs, seq.params.cache_salt, seq.params.lora)
        for i in range(first, end):
            self.pool.register(seq.block_table[i], seq.block_hashes[i])

    def _promised_blocks(self) -> int:
        # prompt blocks of admitted sequences that prefill has not yet taken, and one per fork to come
        return sum(
            max(0, self.pool.blocks_for(s.num_tokens) - len(s.block_table)) + len(s.forks)
            for s in self.running if s.is_prefill
        )

    # --- a step ---------------------------------------------------------------------------------

    def readmit(self) -> None:
        """Start queued sequences in ticket order while they fit; a batch one that does not fit holds back
        only the batch ones behind it. The engine loop calls it before admitting arrivals too: a preempted
        sequence takes a freed slot before any new request does."""
        batch_blocked = False
        for seq in list(self.waiting):
            if seq.params.is_batch and batch_blocked:
                continue
            reason = self._admission_block_for(seq)
            if reason is None:
                self.waiting.remove(seq)
                self._start(seq)
            elif reason == NO_ADAPTER_SLOT:
                continue
            elif seq.params.is_batch:
                batch_blocked = True
            else:
                break

    def schedule(self) -> StepPlan:
        self.readmit()
        plan = StepPlan()
        decodes: list[ScheduledChunk] = []
        prefill_budget = self.max_num_batched_tokens - sum(1 for s in self.running if not s.is_prefill)
        interactive_prefill = any(s.is_prefill and not s.params.is_batch for s in self.running)
        urgent = interactive_prefill or self.interactive_waiting or any(not w.params.is_batch for w in self.waiting)
        batch_prefill_budget = self.rules.batch_prefill_tokens if urgent else prefill_budget
        skips = lean_step_skips(self.running, self.rules) if interactive_prefill and not self._lean_last_step else set()
        self._lean_last_step = False
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            prefill = seq.is_prefill
            budget = min(prefill_budget, batch_prefill_budget) if seq.params.is_batch else prefill_budget
            draft = () if prefill else self._draft(seq, prefill_budget)
            n = min(seq.num_uncomputed_tokens, self.prefill_chunk, budget) if prefill else 1 + len(draft)
            if n == 0 or (not prefill and id(seq) in skips):  # it waits a step, it is not evicted
                self._lean_last_step |= n > 0
                i += 1
                continue
            target = seq.num_computed_tokens + n
            while not self.pool.can_grow(seq, target):
                victim = pool_victim(self.running)
                at = self.running.index(victim)
                if at < i:  # a batch sequence already planned: its chunk leaves the plan, its tokens return
                    returned = self._unplan(plan, decodes, victim)
                    prefill_budget += returned
                    batch_prefill_budget += returned
                    i -= 1
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # it preempted itself: running[i] is the next sequence now
            self.pool.grow(seq, target)
            sample = target == seq.num_tokens + len(draft)
            chunk = ScheduledChunk(seq, seq.num_computed_tokens, n, sample, tuple(seq.forks) if sample else (),
                                   draft)
            prefill_budget -= len(draft)
            if prefill:
                plan.chunks.append(chunk)
                plan.num_prefill_tokens += n
                prefill_budget -= n
                if seq.params.is_batch:
                    batch_prefill_budget -= n
            else:
                decodes.append(chunk)
            i += 1
        plan.chunks.extend(sorted(decodes, key=lambda c: not c.draft_token_ids))  # stable: drafted ones first
        plan.num_decode_seqs = len(decodes)
        plan.num_draft_tokens = sum(len(c.draft_token_ids) for c in decodes)
        return plan

    def _draft(self, seq: Sequence, budget_tokens: int) -> tuple[int, ...]:
        """A decoding sequence's draft this step; () without speculation, or when its blocks are not free now."""
        if self.speculator is None:
            return ()
        limit = self.speculator.draft_limit(seq.backoff, seq.params, seq.num_output_tokens, budget_tokens)
        draft = propose(seq.prompt_token_ids + seq.output_token_ids, limit) if limit else []
        if draft and not self.pool.can_grow(seq, seq.num_tokens + len(draft)):
            return ()  # a draft never preempts
        return tuple(draft)

    @staticmethod
    def _unplan(plan: StepPlan, decodes: list[ScheduledChunk], seq: Sequence) -> int:
        """Take `seq`'s chunk, if any (it may have sat the step out), out of a plan being built; returns its
        prefill tokens (0 for a decode row)."""
        for chunk in decodes:
            if chunk.seq is seq:
                decodes.remove(chunk)
                return 0  # a draft's tokens are not handed back: the step just computes less
        chunk = next((c for c in plan.chunks if c.seq is seq), None)
        if chunk is None:
            return 0
        plan.chunks.remove(chunk)
        plan.num_prefill_tokens -= chunk.num_tokens
        return chunk.num_tokens

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.free(seq)
        seq.num_computed_tokens = 0  # recompute: prompt and output so far are prefilled again
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.preemptions += 1
        self.preemptions_by_class[seq.params.request_class] += 1
        j = 0
        while j < len(self.waiting) and self.waiting[j].ticket < seq.ticket:
            j += 1
        self.waiting.insert(j, seq)

    def update(self, plan: StepPlan, sampled_token_ids: list[int],
               num_accepted: Collection[int] = ()) -> list[Sequence]:
        """Apply a step's results; returns the sequences that got new tokens, in plan order.

        `sampled_token_ids` holds one token per row of `plan.sampled_seqs()`: for a drafted row, the token after
        its accepted draft tokens; `num_accepted` holds, per chunk of `plan.drafted()`, how many of its draft's
        tokens were accepted. Sequences aborted while the step ran are skipped.
        """
        tokens = iter(sampled_token_ids)
        accepted = iter(num_accepted)
        changed: list[Sequence] = []
        for chunk in plan.chunks:
            token = next(tokens) if chunk.sample else None
            fork_tokens = [next(tokens) for _ in chunk.forks]
            seq = chunk.seq
            if chunk.draft_token_ids:
                m = next(accepted)
                if seq.status is SequenceStatus.RUNNING:
                    assert token is not None
                    self._commit_draft(seq, chunk, m, token)
                    changed.append(seq)
                continue
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens = chunk.context_len
            self._register_full_blocks(seq, chunk.start)
            if token is None:
                continue
            forked = [(f, t) for f, t in zip(chunk.forks, fork_tokens, strict=True) if f.fork_of is seq]
            at = self.running.index(seq) + 1 if forked else 0
            for j, (fork, _) in enumerate(forked):  # before the leader may finish and free its blocks
                self._fork(seq, fork, at + j)
            for s, t in [(seq, token), *forked]:
                s.output_token_ids.append(t)
                changed.append(s)
                reason = token_finish_reason(t, s.num_output_tokens, s.params, self.eos_token_ids)
                if reason is not None:
                    self.finish(s, reason)
        return changed

    def _commit_draft(self, seq: Sequence, chunk: ScheduledChunk, num_accepted: int, token: int) -> None:
        """Commit a drafted row: its first `num_accepted` draft tokens (their K/V were written this step), then
        `token`; the sequence ends at the first token that ends it, and the tokens after it are dropped."""
        draft = chunk.draft_token_ids
        assert self.speculator is not None and 0 <= num_accepted <= len(draft)
        self.speculator.observe(seq.backoff, len(draft), num_accepted)
        before = seq.num_output_tokens
        new = [*draft[:num_accepted], token]
        seq.output_token_ids.extend(new)
        seq.num_computed_tokens = chunk.context_len - (len(draft) - num_accepted)  # committed positions only
        self._register_full_blocks(seq, chunk.start)
        keep = self.pool.blocks_for(seq.num_tokens)  # the last token's position included: it is computed next
        if len(seq.block_table) > keep:  # blocks that held only rejected tokens
            rejected = seq.block_table[keep:]
            del seq.block_table[keep:]
            self.pool.release(rejected[::-1])
        for j, t in enumerate(new):
            reason = token_finish_reason(t, before + j + 1, seq.params, self.eos_token_ids)
            if reason is not None:
                del seq.output_token_ids[before + j + 1:]
                self.finish(seq, reason)
                return

    def _fork(self, leader: Sequence, fork: Sequence, at: int) -> None:
        """`fork` shares the leader's full prompt blocks and computes the rest itself, after its first token;
        it runs right behind its leader, as if admitted with it (the same ticket, the same turn to be preempted)."""
        k = leader.num_prompt_tokens // self.pool.block_size  # the prompt's full blocks, all computed by now
        fork.block_table = self.pool.fork(leader.block_table[:k])
        fork.num_computed_tokens = k * self.pool.block_size
        leader.forks.remove(fork)
        fork.fork_of = None
        fork.status = SequenceStatus.RUNNING
        self.running.insert(at, fork)

    # --- endings --------------------------------------------------------------------------------

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence and free its blocks at once (stop, length, abort); choices still waiting to fork
        from it end with it."""
        if seq.fork_of is not None:
            seq.fork_of.forks.remove(seq)
            seq.fork_of = None
        elif seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            return
        for fork in list(seq.forks):
            self.finish(fork, reason)
        self.pool.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        group = self._by_id[seq.request_id]
        group.remove(seq)
        if not group:
            del self._by_id[seq.request_id]

    def abort(self, request_id: str) -> Sequence | None:
        """End every sequence of a request; returns its first, or None if the request is unknown or done."""
        group = list(self._by_id.get(request_id, ()))
        for seq in group:
            self.finish(seq, "abort")
        return group[0] if group else None

    def get(self, request_id: str) -> Sequence | None:
        """A request's first unfinished sequence."""
        group = self._by_id.get(request_id)
        return group[0] if group else None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def requests_by_tenant(self) -> Counter[str]:
        """Unfinished requests (admitted, running or preempted) per tenant."""
        return Counter(group[0].params.tenant for group in self._by_id.values())

    def count_by_class(self) -> tuple[dict[str, int], dict[str, int]]:
        """(waiting, running) sequences by class, every class included."""
        waiting, running = dict.fromkeys(REQUEST_CLASSES, 0), dict.fromkeys(REQUEST_CLASSES, 0)
        for s in self.waiting:
            waiting[s.params.request_class] += s.num_seqs
        for s in self.running:
            running[s.params.request_class] += s.num_seqs
        return waiting, running

    def kv_positions(self) -> tuple[int, int]:
        """(positions holding tokens, positions allocated) over running sequences."""
        held = sum(s.num_computed_tokens for s in self.running)
        return held, self.pool.num_used_blocks * self.pool.block_size
