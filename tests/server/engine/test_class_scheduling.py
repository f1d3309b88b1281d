"""The scheduler's class rules (engine/class_rules.py), one case each, with no model: whom a dry pool
preempts, the interactive slot reserve, slot preemption for interactive arrivals, and what batch work may
take of a step while interactive work waits."""

from __future__ import annotations

from flotilla_server.engine.class_rules import ClassRules
from flotilla_server.engine.kv_pool import BlockPool
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.scheduler import Scheduler
from flotilla_server.engine.sequence import Sequence, SequenceStatus


def seq(rid: str, prompt_len: int, batch: bool = False, max_tokens: int = 100) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, request_class="batch" if batch else "interactive")
    return Sequence(rid, list(range(1, prompt_len + 1)), params, ticket=-1)


def run_step(sched: Scheduler, token: int = 7):
    plan = sched.schedule()
    sched.update(plan, [token for c in plan.chunks if c.sample])
    return plan


def scheduler(num_blocks: int = 100, slots: int = 4, rules: ClassRules | None = None, **kw) -> Scheduler:
    return Scheduler(BlockPool(num_blocks, 2), max_num_seqs=slots, max_num_batched_tokens=kw.pop("budget", 256),
                     prefill_chunk=kw.pop("chunk", 256), reserve_blocks=0, rules=rules, **kw)


def test_a_dry_pool_preempts_batch_before_a_more_recent_interactive_sequence() -> None:
    sched = scheduler(num_blocks=6, slots=3)
    for s in (seq("i1", 4), seq("b", 4, batch=True), seq("i2", 4)):  # 2 blocks each: the pool is full
        assert sched.try_admit(s) is None
    run_step(sched)
    plan = sched.schedule()  # i1 grows into a third block: b goes, though i2 was admitted after it
    assert [s.request_id for s in plan.preempted] == ["b"]
    assert sched.preemptions_by_class == {"interactive": 0, "batch": 1}
    assert [s.request_id for s in sched.running] == ["i1", "i2"]


def test_with_no_batch_sequence_the_most_recent_is_preempted_as_before() -> None:
    sched = scheduler(num_blocks=6, slots=3)
    for rid in ("a", "b", "c"):
        sched.try_admit(seq(rid, 4))
    run_step(sched)
    assert [s.request_id for s in sched.schedule().preempted] == ["c"]
    assert sched.preemptions_by_class == {"interactive": 1, "batch": 0}


def test_batch_work_never_takes_the_interactive_reserve() -> None:
    sched = scheduler(slots=4, rules=ClassRules(interactive_reserve_slots=1))
    assert [sched.try_admit(seq(f"b{i}", 2, batch=True)) for i in range(4)] == [None, None, None, "no_slot"]
    assert sched.try_admit(seq("i", 2)) is None  # the reserved slot
    assert sched.num_slots_used == 4
    sched = scheduler(slots=4, rules=ClassRules(interactive_reserve_slots=1))
    assert [sched.try_admit(seq(f"i{i}", 2)) for i in range(2)] == [None, None]
    # a cap on what batch work holds, not on the free slots: beside interactive work, batch takes the rest
    assert [sched.try_admit(seq(f"b{i}", 2, batch=True)) for i in range(3)] == [None, None, "no_slot"]


def test_an_interactive_arrival_takes_the_newest_batch_slot_a_bounded_number_of_times() -> None:
    sched = scheduler(slots=2, rules=ClassRules(batch_max_preemptions=1))
    old, new = seq("b-old", 2, batch=True), seq("b-new", 2, batch=True)
    sched.try_admit(old), sched.try_admit(new)
    run_step(sched)
    assert sched.try_admit(seq("i1", 2)) is None
    assert new.status is SequenceStatus.WAITING and new.num_preemptions == 1 and old.status is SequenceStatus.RUNNING
    assert sched.try_admit(seq("i2", 2)) is None  # b-new is at its bound: b-old gives its slot
    assert old.status is SequenceStatus.WAITING
    assert sched.try_admit(seq("i3", 2)) == "no_slot"  # nothing left under the bound
    assert sched.try_admit(seq("b2", 2, batch=True)) == "no_slot"  # batch never preempts


def test_preempted_batch_sequences_do_not_hold_back_interactive_arrivals() -> None:
    sched = scheduler(num_blocks=6, slots=3)
    for s in (seq("i1", 4), seq("b", 4, batch=True), seq("i2", 4)):
        sched.try_admit(s)
    run_step(sched)
    run_step(sched)  # b preempted, waiting
    assert [s.request_id for s in sched.waiting] == ["b"]
    sched.finish(sched.running[1], "stop")  # i2 done: room for one more
    assert sched.try_admit(seq("i3", 2)) is None  # past the waiting batch sequence
    assert sched.try_admit(seq("b2", 2, batch=True)) is not None  # but batch does not overtake batch


def test_batch_prefill_is_capped_while_interactive_work_waits() -> None:
    sched = scheduler(slots=4, rules=ClassRules(batch_prefill_tokens=8))
    sched.try_admit(seq("b", 100, batch=True))
    assert sched.schedule().num_prefill_tokens == 100  # alone: the whole prompt
    sched = scheduler(slots=4, rules=ClassRules(batch_prefill_tokens=8))
    sched.try_admit(seq("b", 100, batch=True))
    sched.interactive_waiting = True
    assert sched.schedule().num_prefill_tokens == 8


def test_a_step_that_prefills_interactive_work_leaves_batch_decodes_out_never_twice_in_a_row() -> None:
    sched = scheduler(slots=4, chunk=4)
    batch = [seq(f"b{i}", 2, batch=True) for i in range(2)]
    for s in batch:
        sched.try_admit(s)
    run_step(sched)  # both decode from now on
    sched.try_admit(seq("i", 12))  # three prefill chunks of 4
    kinds = []
    for _ in range(4):
        plan = run_step(sched)
        kinds.append(sorted(c.seq.request_id for c in plan.chunks))
    assert kinds == [["i"], ["b0", "b1", "i"], ["i"], ["b0", "b1", "i"]]


def test_a_preempted_batch_sequence_takes_a_freed_slot_before_new_arrivals() -> None:
    """The engine loop calls `readmit` before it admits arrivals: else, under constant interactive load,
    every freed slot would go to a new arrival and a preempted batch sequence would never run again."""
    sched = scheduler(slots=2)
    b, i1 = seq("b", 2, batch=True), seq("i1", 2)
    sched.try_admit(b), sched.try_admit(i1)
    run_step(sched)
    assert sched.try_admit(seq("i2", 2)) is None and b.status is SequenceStatus.WAITING  # b gave its slot
    sched.finish(i1, "stop")
    sched.readmit()
    assert b.status is SequenceStatus.RUNNING and sched.num_slots_used == 2
