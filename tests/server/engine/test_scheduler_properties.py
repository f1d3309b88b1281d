"""Invariants of the block pool and scheduler under random traffic, with no model.

A fake step samples random tokens; hypothesis chooses arrivals, lengths, choices per prompt (n), EOS and
cancellations.
"""

from __future__ import annotations

import random

from flotilla_server.engine.feasibility import blocks_needed
from flotilla_server.engine.kv_pool import BlockPool
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.scheduler import Scheduler, infeasible_reason
from flotilla_server.engine.sequence import Sequence, SequenceStatus, new_request
from hypothesis import event, given, settings
from hypothesis import strategies as st

EOS = 0


def check_state(sched: Scheduler) -> None:
    live = list(sched.running) + list(sched.waiting)
    sched.pool.check([s.block_table for s in live])
    assert sched.num_slots_used <= sched.max_num_seqs
    assert all(f.fork_of is s and f.block_table == [] for s in live for f in s.forks)
    assert all(s.block_table == [] and s.num_computed_tokens == 0 for s in sched.waiting)
    assert all(s.status is SequenceStatus.RUNNING for s in sched.running)


def check_plan(sched: Scheduler, plan) -> None:
    check_state(sched)
    assert plan.num_tokens <= sched.max_num_batched_tokens
    seen_decode = False
    ids = set()
    for c in plan.chunks:
        assert c.seq.key not in ids, "a sequence scheduled twice in one step"
        ids.add(c.seq.key)
        assert 1 <= c.num_tokens <= sched.prefill_chunk
        assert c.context_len <= len(c.seq.block_table) * sched.pool.block_size
        is_decode = c.num_tokens == 1 and c.sample and c.start == c.seq.num_tokens - 1
        if is_decode:
            seen_decode = True
        else:
            assert not seen_decode, "a prefill chunk after a decode row"


scenario = st.fixed_dictionaries(
    {
        "num_blocks": st.integers(4, 64),
        "block_size": st.sampled_from([1, 2, 4, 16]),
        "max_num_seqs": st.integers(1, 8),
        "extra_budget": st.integers(0, 64),
        "prefill_chunk": st.integers(1, 48),
        "seed": st.integers(0, 2**31),
        "requests": st.lists(
            st.tuples(
                st.integers(0, 30),  # arrival step
                st.integers(1, 80),  # prompt tokens
                st.integers(1, 40),  # max_tokens
                st.booleans(),  # ignore_eos
                st.one_of(st.none(), st.integers(0, 60)),  # cancelled at step
                st.integers(1, 3),  # n
            ),
            min_size=1,
            max_size=24,
        ),
        "admit_directly": st.booleans(),  # the HTTP path (try_admit) instead of the queue
    }
)


@settings(max_examples=600, deadline=None)
@given(scenario)
def test_random_traffic_keeps_invariants_and_finishes_every_feasible_request(sc) -> None:
    rng = random.Random(sc["seed"])
    pool = BlockPool(sc["num_blocks"], sc["block_size"])
    budget = sc["max_num_seqs"] + sc["extra_budget"]
    sched = Scheduler(pool, sc["max_num_seqs"], budget, sc["prefill_chunk"], eos_token_ids=[EOS])
    max_model_len = 10_000
    pending = sorted(enumerate(sc["requests"]), key=lambda r: r[1][0])
    feasible: dict[str, Sequence] = {}  # each request's first sequence
    choices: list[Sequence] = []
    cancel_at: dict[str, int] = {}
    deferred: list[Sequence] = []
    step = 0
    forked = False
    while pending or deferred or sched.has_unfinished():
        assert step < 5000, "no progress: the scheduler is stuck"
        while pending and pending[0][1][0] <= step:
            i, (_, prompt_len, max_tokens, ignore_eos, cancel, n) = pending.pop(0)
            if infeasible_reason(prompt_len, max_tokens, max_model_len, pool.num_blocks, pool.block_size, n,
                                 sched.max_num_seqs):
                assert blocks_needed(prompt_len, max_tokens, pool.block_size, n) > pool.num_blocks \
                    or n > sched.max_num_seqs
                continue
            (seq,) = new_request(f"r{i}", [[rng.randrange(1, 50) for _ in range(prompt_len)]],
                                 SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, n=n))
            feasible[seq.request_id] = seq
            choices += [seq, *seq.forks]
            if cancel is not None:
                cancel_at[seq.request_id] = step + cancel
            if sc["admit_directly"]:
                deferred.append(seq)
            else:
                sched.add(seq)
        # the HTTP driver: FIFO, retried every step
        while deferred and sched.try_admit(deferred[0]) is None:
            deferred.pop(0)
        for rid, at in list(cancel_at.items()):
            if at <= step:
                del cancel_at[rid]
                if sched.abort(rid) is None and feasible[rid] in deferred:
                    deferred.remove(feasible[rid])
                    for s in (feasible[rid], *feasible[rid].forks):
                        s.status, s.finish_reason = SequenceStatus.FINISHED, "abort"
        plan = sched.schedule()
        check_plan(sched, plan)
        forked = forked or any(c.forks for c in plan.chunks)
        if sched.running:
            assert not plan.is_empty, "running sequences but nothing scheduled"
            # the oldest running sequence progresses every step
            oldest = min(sched.running, key=lambda s: s.ticket)
            assert any(c.seq is oldest for c in plan.chunks)
        sampled = [EOS if rng.random() < 0.05 else rng.randrange(1, 50) for _ in plan.sampled_seqs()]
        sched.update(plan, sampled)
        check_state(sched)
        step += 1
    event(f"preempted={sched.preemptions > 0}")
    event(f"forked={forked}")
    event(f"deferred={sum(sched.deferrals.values()) > 0}")
    assert pool.num_free_blocks == pool.num_blocks
    for seq in choices:
        assert seq.is_finished and seq.block_table == []
        if seq.finish_reason == "length":
            assert seq.num_output_tokens == seq.params.max_tokens
        elif seq.finish_reason == "stop":
            assert seq.output_token_ids[-1] == EOS and not seq.params.ignore_eos
        else:
            assert seq.finish_reason == "abort"
