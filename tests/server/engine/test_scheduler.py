"""The scheduler's rules, one case each, with no model: admission, budget, preemption, aborts."""

from __future__ import annotations

import pytest
from flotilla_server.engine.kv_pool import BlockPool, PoolExhausted
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.scheduler import Scheduler, infeasible_reason
from flotilla_server.engine.sequence import Sequence, SequenceStatus


def seq(rid: str, prompt_len: int, max_tokens: int = 100) -> Sequence:
    return Sequence(rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens), ticket=-1)


def run_step(sched: Scheduler, token: int = 7):
    plan = sched.schedule()
    sched.update(plan, [token for c in plan.chunks if c.sample])
    return plan


def test_prefill_is_chunked_and_put_before_decodes() -> None:
    sched = Scheduler(BlockPool(100, 4), max_num_seqs=4, max_num_batched_tokens=16, prefill_chunk=8)
    sched.add(seq("a", 3))
    run_step(sched)  # a prefilled, sampled its first token
    sched.add(seq("b", 20))
    plan = sched.schedule()
    assert [(c.seq.request_id, c.num_tokens, c.sample) for c in plan.chunks] == [("b", 8, False), ("a", 1, True)]
    assert (plan.num_prefill_tokens, plan.num_decode_seqs) == (8, 1)


def test_decode_rows_are_budgeted_before_prefill() -> None:
    sched = Scheduler(BlockPool(100, 4), max_num_seqs=4, max_num_batched_tokens=8, prefill_chunk=8)
    for rid in "abc":
        sched.add(seq(rid, 1))
    run_step(sched)
    sched.add(seq("d", 30))
    plan = sched.schedule()
    assert plan.num_tokens == 8 and plan.num_decode_seqs == 3 and plan.num_prefill_tokens == 5


def test_admission_needs_a_slot_and_prompt_blocks_plus_reserve() -> None:
    sched = Scheduler(BlockPool(10, 4), max_num_seqs=2, max_num_batched_tokens=64, prefill_chunk=64, reserve_blocks=2)
    assert sched.try_admit(seq("a", 16)) is None  # alone: 4 blocks, no reserve needed
    assert sched.admission_block(16) is None  # 4 + 2 reserve <= 10 - 4 promised
    assert sched.admission_block(17) == "no_blocks"  # 5 + 2 > 6
    assert sched.try_admit(seq("b", 17)) == "no_blocks"
    assert sched.try_admit(seq("b", 4)) is None
    assert sched.try_admit(seq("c", 1)) == "no_slot"
    assert dict(sched.deferrals) == {"no_slot": 1, "no_blocks": 1}
    assert sched.pool.num_used_blocks == 0  # admission allocates nothing; prefill takes blocks on demand


def test_dry_pool_preempts_most_recent_which_returns_to_queue_head_with_its_ticket() -> None:
    sched = Scheduler(BlockPool(6, 2), max_num_seqs=3, max_num_batched_tokens=64, prefill_chunk=64, reserve_blocks=0)
    for rid in "abc":
        sched.add(seq(rid, 4))  # 2 blocks each: the pool is full after prefill
    run_step(sched)
    sched.add(seq("d", 1))
    plan = sched.schedule()  # a grows into a third block: c (latest admitted) is preempted
    assert [s.request_id for s in plan.preempted] == ["c"]
    assert [s.request_id for s in sched.waiting] == ["c", "d"]
    c = sched.waiting[0]
    assert (c.ticket, c.num_computed_tokens, c.block_table, c.num_preemptions) == (2, 0, [], 1)
    assert sched.preemptions == 1
    assert [ch.seq.request_id for ch in plan.chunks] == ["a", "b"]
    sched.update(plan, [7, 7])


def test_oldest_progresses_even_when_it_must_preempt_everyone() -> None:
    sched = Scheduler(BlockPool(4, 2), max_num_seqs=2, max_num_batched_tokens=64, prefill_chunk=64, reserve_blocks=0)
    sched.add(seq("a", 2, max_tokens=6))
    sched.add(seq("b", 2, max_tokens=6))
    finished_order = []
    for _ in range(40):
        if not sched.has_unfinished():
            break
        plan = run_step(sched)
        finished_order += [c.seq.request_id for c in plan.chunks if c.seq.is_finished]
    assert finished_order == ["a", "b"]
    assert sched.preemptions >= 1
    assert sched.pool.num_free_blocks == 4


def test_abort_frees_blocks_at_once_and_skips_the_inflight_result() -> None:
    pool = BlockPool(10, 4)
    sched = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=64, prefill_chunk=64)
    sched.add(seq("a", 9))
    plan = sched.schedule()
    assert pool.num_used_blocks == 3
    aborted = sched.abort("a")
    assert aborted is not None and aborted.finish_reason == "abort" and pool.num_used_blocks == 0
    assert sched.update(plan, [7]) == []
    assert not sched.has_unfinished() and sched.abort("a") is None


def test_eos_and_max_tokens_finish_and_free() -> None:
    sched = Scheduler(BlockPool(10, 4), 2, 64, 64, eos_token_ids=[0])
    sched.add(seq("a", 3, max_tokens=2))
    sched.add(seq("b", 3, max_tokens=5))
    run_step(sched, token=5)
    plan = sched.schedule()
    sched.update(plan, [5, 0])
    assert (sched.get("a"), sched.get("b")) == (None, None)
    assert [c.seq.finish_reason for c in plan.chunks] == ["length", "stop"]
    assert sched.pool.num_free_blocks == 10


def test_duplicate_request_id_is_refused() -> None:
    sched = Scheduler(BlockPool(10, 4), 2, 64, 64)
    sched.add(seq("a", 3))
    with pytest.raises(ValueError, match="already in use"):
        sched.add(seq("a", 3))


def test_infeasible_reasons_say_what_to_change() -> None:
    assert infeasible_reason(10, 10, 32, 100, 16) is None
    assert "shorten the prompt or lower max_tokens" in infeasible_reason(30, 10, 32, 100, 16)
    assert "larger KV cache" in infeasible_reason(30, 10, 100, 2, 16)
    assert "empty" in infeasible_reason(0, 10, 100, 2, 16)


def test_pool_refuses_double_free_and_acting_without_asking() -> None:
    pool = BlockPool(2, 4)
    s = seq("a", 1)
    with pytest.raises(PoolExhausted):
        pool.allocate(3)
    pool.grow(s, 8)
    assert pool.ref_count(s.block_table[0]) == 1 and not pool.can_allocate(1)
    shared = pool.fork(s.block_table[:1])
    pool.release(shared)
    pool.free(s)
    with pytest.raises(PoolExhausted, match="double free"):
        pool.release([0])
    assert s.status is SequenceStatus.WAITING
