"""Which adapter slot a sequence's LoRA adapter gets (policy): a pure function, so that the rule is tested on
tables and properties apart from the tensors it moves (engine/adapter_cache.py carries it out).

Rules (docs/serving.md, "LoRA adapters"):
- an adapter already resident keeps its slot: no copy;
- else a free slot, the lowest first;
- else the slot of the least recently used resident adapter that has no sequence running or waiting in the
  engine (its count is 0): that adapter is evicted;
- else None: every slot is pinned by an adapter in use, and the sequence waits (it is never refused for it).
Ties in last use go to the lower slot, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotChoice:
    slot: int
    evicts: str | None = None  # the adapter that held the slot, when one is evicted
    load: bool = True  # False: the adapter is already in the slot

    def __post_init__(self) -> None:
        if self.evicts is not None and not self.load:
            raise ValueError("a slot that keeps its adapter evicts nothing")


def choose_slot(resident: Sequence[str | None], wanted: str, sequences_by_adapter: Mapping[str, int],
                last_used_s: Mapping[str, float]) -> SlotChoice | None:
    """`resident`: per slot, the adapter in it (None: free); `sequences_by_adapter`: running and waiting
    sequences per adapter (absent: 0); `last_used_s`: when each resident adapter last served a step or an
    admission (absent: never). Returns the slot for `wanted`, or None when every slot is pinned."""
    if wanted in resident:
        return SlotChoice(resident.index(wanted), load=False)
    if None in resident:
        return SlotChoice(resident.index(None))
    unpinned = [(last_used_s.get(name, float("-inf")), slot) for slot, name in enumerate(resident)
                if name is not None and sequences_by_adapter.get(name, 0) <= 0]
    if not unpinned:
        return None
    _, slot = min(unpinned)
    return SlotChoice(slot, evicts=resident[slot])
