"""Today's FIFO admission, kept as the reference of engine/fair_admission.py: with no request marked, the fair
policy the engine loop runs makes exactly this policy's calls (tests/server/engine/test_fair_admission.py).

The rules (docs/architecture.md, "Design rules: admission"): FIFO by ticket; when the head cannot be admitted, later
arrivals may overtake it at most ``max_overtakes`` times, after which the head reserves capacity and
nobody else enters until it does. Whether a request fits is never decided here: the caller passes
``try_admit``, which asks the engine (admissibility is computed from state, never from counted signals).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    ticket: int
    item: T
    overtaken: int = 0  # how many later arrivals were admitted while this entry was the head


@dataclass
class AdmissionPolicy(Generic[T]):
    """A bounded FIFO of waiters with bounded overtaking of the head."""

    depth: int  # queue capacity: queue_depth_per_slot × max_num_seqs
    max_overtakes: int  # K: later arrivals admitted past a blocked head before it reserves capacity
    scan_limit: int = 0  # waiters behind a blocked head tried per round; 0 means max_overtakes
    _entries: dict[int, _Entry[T]] = field(default_factory=dict)  # insertion order == ticket order
    _tickets: dict[T, int] = field(default_factory=dict)  # item -> ticket; items are hashable and unique
    _next_ticket: int = 0

    def __post_init__(self) -> None:
        if self.depth < 0:
            raise ValueError(f"queue depth must be >= 0, got {self.depth}")
        if self.max_overtakes < 0:
            raise ValueError(f"max_overtakes must be >= 0, got {self.max_overtakes}")

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[T]:
        return (e.item for e in self._entries.values())

    def is_full(self) -> bool:
        return len(self._entries) >= self.depth

    def push(self, item: T) -> int:
        """Enqueue ``item`` and return its ticket; the caller checks ``is_full`` first."""
        if item in self._tickets:
            raise ValueError("item is already queued")
        if self.is_full():
            raise OverflowError("admission queue is full")
        ticket = self._next_ticket
        self._next_ticket += 1
        self._entries[ticket] = _Entry(ticket, item)
        self._tickets[item] = ticket
        return ticket

    def remove(self, item: T) -> bool:
        """Drop a waiter that gave up (timeout, client gone); False if it was no longer queued."""
        ticket = self._tickets.pop(item, None)
        if ticket is None:
            return False
        del self._entries[ticket]
        return True

    def head_overtaken(self) -> int:
        head = next(iter(self._entries.values()), None)
        return 0 if head is None else head.overtaken

    def admit_round(self, try_admit: Callable[[T], bool]) -> list[T]:
        """Admit whoever fits now, in ticket order, honouring the overtaking bound.

        ``try_admit(item)`` must admit atomically and return True, or change nothing and return False.
        Returns the admitted items in admission order; they are no longer queued.
        """
        admitted: list[T] = []
        while self._entries:
            head = next(iter(self._entries.values()))
            if not try_admit(head.item):
                break
            self._pop(head)
            admitted.append(head.item)
        if not self._entries:
            return admitted
        head = next(iter(self._entries.values()))
        scan_limit = self.scan_limit or self.max_overtakes
        behind = list(self._entries.values())[1 : 1 + scan_limit]
        for entry in behind:
            if head.overtaken >= self.max_overtakes:
                break  # the head now reserves capacity
            if try_admit(entry.item):
                self._pop(entry)
                head.overtaken += 1
                admitted.append(entry.item)
        return admitted

    def _pop(self, entry: _Entry[T]) -> None:
        del self._entries[entry.ticket]
        del self._tickets[entry.item]
