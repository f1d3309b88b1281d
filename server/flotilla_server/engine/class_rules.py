"""The scheduler's rules for request classes: whom to preempt, what batch work may take of a step.

Kept apart from the scheduler's mechanics so that each rule reads on its own (docs/serving.md, "Priorities
and tenants"); the admission order between classes and tenants is engine/fair_admission.py's.

- The victim of a dry pool is the least urgent class first, then the most recently admitted: batch work
  gives its blocks back before any interactive sequence does.
- An interactive request that finds no slot takes one from the newest batch sequence, if batch work holds
  more than its weighted share of the slots (`batch_share_slots`) and that batch request was preempted
  fewer than `batch_max_preemptions` times: batch work keeps its share under any interactive load, and
  always finishes.
- While interactive work waits or prefills, batch prefill chunks take at most `batch_prefill_tokens` of a
  step, and a step that prefills interactive work leaves out the decode rows of the batch sequences beyond
  batch work's share (the most recently admitted), never two steps in a row: the interactive prompt's step
  is nearly as short as it would be alone, batch work keeps its share of every step, and the rest of it at
  least every other step.
- Batch work never holds more than `max_num_seqs - interactive_reserve_slots` slots: the reserve is
  interactive's alone, whatever the load.
"""

from __future__ import annotations

from collections.abc import Sequence as Seqs
from dataclasses import dataclass

from flotilla_server.engine.sequence import Sequence


@dataclass(frozen=True)
class ClassRules:
    interactive_reserve_slots: int = 0
    batch_max_preemptions: int = 4
    batch_prefill_tokens: int = 64
    batch_share_slots: int = 0  # slots batch work keeps against interactive arrivals: its weighted share

    def __post_init__(self) -> None:
        for name in ("interactive_reserve_slots", "batch_max_preemptions", "batch_prefill_tokens",
                     "batch_share_slots"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def batch_room(self, running: Seqs[Sequence], max_num_seqs: int) -> int:
        """Slots batch work may still take: it holds at most all but the reserve."""
        return max_num_seqs - self.interactive_reserve_slots - batch_slots(running)

    def fits_class_slots(self, seq: Sequence, running: Seqs[Sequence], max_num_seqs: int) -> bool:
        """Whether `seq`'s class may take the slots it needs."""
        return not seq.params.is_batch or seq.num_seqs <= self.batch_room(running, max_num_seqs)


def batch_slots(running: Seqs[Sequence]) -> int:
    return sum(s.num_seqs for s in running if s.params.is_batch)


def lean_step_skips(running: Seqs[Sequence], rules: ClassRules) -> set[int]:
    """The batch sequences (by id) whose decode rows a lean step leaves out: all but the `batch_share_slots`
    admitted first."""
    batch = [s for s in running if s.params.is_batch]
    return {id(s) for s in batch[rules.batch_share_slots:]}


def pool_victim(running: Seqs[Sequence]) -> Sequence:
    """Whom to preempt when the pool is dry: the most recently admitted batch
    sequence (even one already in the step's plan, whose chunk then leaves it), else the most recently
    admitted one, which is not yet in the plan."""
    for seq in reversed(running):
        if seq.params.is_batch:
            return seq
    return running[-1]


def slot_victim(running: Seqs[Sequence], rules: ClassRules) -> Sequence | None:
    """The batch sequence whose slot a waiting interactive request may take: the newest batch sequence
    still under its preemption bound, while batch work holds more than its share; else None."""
    if batch_slots(running) <= rules.batch_share_slots:
        return None
    for seq in reversed(running):
        if seq.params.is_batch and seq.num_preemptions < rules.batch_max_preemptions:
            return seq
    return None
