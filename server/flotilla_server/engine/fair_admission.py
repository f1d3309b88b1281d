"""Fair admission: who of the waiters enters next when request classes and tenants share one engine.

One FIFO (engine/admission_policy.py) lets a flood of batch work sit in front of live chat, and one tenant
crowd out the rest (docs/serving.md, "Priorities and tenants"). This policy replaces it in the engine loop
and keeps its spirit: a pure decision, no asyncio and no engine, so that it can be tested exhaustively;
whether a request fits is still asked of the engine through ``try_admit``. The rules:

1. Queues. One per (class, tenant) with ``tenant_fairness``, else one per class (the tenant is ignored).
   Within a queue the lowest ``priority`` goes first, then the lowest ticket; an entry that later-ticket
   entries of its queue were admitted ahead of ``aging_admissions`` times goes before every unaged one
   (oldest first). Equal priorities, one class, no tenant fairness: today's FIFO, try for try.
2. Shares. Stride scheduling on two levels, the classes by ``class_weights``, then the chosen class's
   queues by ``tenant_weights``: each admission adds 1/weight to its pass, and the one whose pass would be
   lowest after its next admission goes first (ties: REQUEST_CLASSES order, then tenant name). Passes are
   exact fractions: no float drift, no random tie. A queue or class that was empty, or skipped by rule 3
   while others were admitted, is lifted to the virtual time (the highest pass admitted from), so it
   banks no credit while it could not be served.
3. Eligibility. A tenant with ``tenant_max_running`` running (only with ``tenant_fairness``) is skipped, as
   is a batch entry that needs more than the free slots or than ``batch_slots``, the slots batch work may
   still hold (the caller's count: all but the interactive reserve, less what batch work holds, so the
   reserve is interactive's whatever the load): a skipped queue sits the round out, it does not block. Interactive entries are always asked: the engine may free a slot for
   them (it preempts batch work), and a FIFO entry must be tried exactly as today.
4. Blocking. A queue head that ``try_admit`` refuses is a blocked head: the ``max_overtakes`` entries
   behind it in its queue may still be tried, other queues go on in fair order, and each later admission
   of the round overtakes every blocked head once. A head overtaken ``max_overtakes`` times reserves
   capacity: the round ends, and each later round admits nobody before it (oldest such head first), even
   while rule 3 keeps it out: while it waits, running work and slots only drain.
5. A round tries an item at most once, and ends when no queue has an eligible candidate left.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from math import isfinite
from types import MappingProxyType
from typing import Generic, TypeVar

from flotilla_contract.classes import INTERACTIVE, NO_TENANT, REQUEST_CLASSES

T = TypeVar("T")


def _weights(weights: Mapping[str, float], what: str) -> Mapping[str, float]:
    for name, weight in weights.items():
        if not isinstance(weight, int | float) or not (weight > 0 and isfinite(weight)):
            raise ValueError(f"{what}[{name!r}] must be a finite number > 0, got {weight!r}")
    return MappingProxyType(dict(weights))


@dataclass(frozen=True)
class FairnessConfig:
    class_weights: Mapping[str, float]  # every class in REQUEST_CLASSES, each > 0
    tenant_weights: Mapping[str, float] = field(default_factory=dict)  # tenants not named weigh 1.0
    tenant_max_running: int | None = None  # a tenant with this many running waits (only with tenant_fairness)
    tenant_fairness: bool = False  # queues per (class, tenant); False: one FIFO per class
    max_overtakes: int = 64  # K: admissions past a blocked head before it reserves capacity
    aging_admissions: int = 64  # later-ticket admissions past an entry before it goes first; 0: no priorities

    def __post_init__(self) -> None:
        missing = [c for c in REQUEST_CLASSES if c not in self.class_weights]
        unknown = sorted(set(self.class_weights) - set(REQUEST_CLASSES))
        if missing or unknown:
            problems = [f"no weight for {c!r}" for c in missing] + [f"{c!r} is not a class" for c in unknown]
            classes = ", ".join(REQUEST_CLASSES)
            raise ValueError(f"class_weights must weigh exactly {classes}: {'; '.join(problems)}")
        object.__setattr__(self, "class_weights", _weights(self.class_weights, "class_weights"))
        object.__setattr__(self, "tenant_weights", _weights(self.tenant_weights, "tenant_weights"))
        for name in ("max_overtakes", "aging_admissions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        cap = self.tenant_max_running
        if cap is not None and (not isinstance(cap, int) or cap < 1):
            raise ValueError(f"tenant_max_running must be an integer >= 1 or None (no cap), got {cap!r}")
        if not isinstance(self.tenant_fairness, bool):
            raise ValueError(f"tenant_fairness must be True or False, got {self.tenant_fairness!r}")


@dataclass(eq=False)
class _Queue(Generic[T]):
    """One queue's stride-scheduled share among its class's queues."""

    tenant: str  # NO_TENANT for every queue without tenant fairness
    stride: Fraction  # 1 / tenant weight
    pass_: Fraction
    entries: dict[int, _Entry[T]] = field(default_factory=dict)  # ticket -> entry, in ticket order
    head: _Entry[T] | None = None  # cache of the first entry by rule 1; None: recompute


@dataclass(eq=False)
class _Entry(Generic[T]):
    ticket: int
    item: T
    request_class: str
    tenant: str  # as pushed, for caps, even where the queue ignores it
    priority: int
    num_slots: int
    queue: _Queue[T]
    passed: int = 0  # later-ticket admissions from its queue while it waited (rule 1: aging)
    overtaken: int = 0  # admissions in rounds where it was refused as a head, after the refusal (rule 4)
    blocked: bool = False  # it was refused as a head at least once


@dataclass(eq=False)
class _Class(Generic[T]):
    stride: Fraction  # 1 / class weight
    pass_: Fraction = Fraction(0)
    vtime: Fraction = Fraction(0)  # the highest queue pass admitted from in this class
    queues: dict[str, _Queue[T]] = field(default_factory=dict)  # non-empty queues only
    idle_passes: dict[str, Fraction] = field(default_factory=dict)  # emptied queues' passes ahead of vtime


@dataclass(eq=False)
class _Round(Generic[T]):
    free_slots: int
    running: dict[str, int]  # by tenant, this round's admissions included
    batch_slots: int  # slots batch work may still take (rule 3)
    windows: dict[_Queue[T], deque[_Entry[T]]] = field(default_factory=dict)  # blocked head's queue -> rest
    done: set[_Queue[T]] = field(default_factory=set)  # no candidate left this round
    skipped: set[_Queue[T]] = field(default_factory=set)  # sat out by rule 3 without a refusal
    blocked_heads: list[_Entry[T]] = field(default_factory=list)


class FairAdmissionPolicy(Generic[T]):
    """Waiters by class, tenant and priority, admitted by weighted fair queuing with bounded overtaking."""

    def __init__(self, config: FairnessConfig) -> None:
        self.config = config
        self._classes: dict[str, _Class[T]] = {  # REQUEST_CLASSES order: the tie-break
            c: _Class(1 / Fraction(config.class_weights[c])) for c in REQUEST_CLASSES}
        self._vtime = Fraction(0)  # the highest class pass admitted from
        self._entries: dict[T, _Entry[T]] = {}  # items are hashable and unique
        self._holders: set[_Entry[T]] = set()  # heads that reserve capacity (rule 4)
        self._next_ticket = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._entries))

    def push(self, item: T, *, request_class: str, tenant: str, priority: int, num_slots: int) -> int:
        """Enqueue ``item`` and return its ticket."""
        cls = self._class(request_class)
        if item in self._entries:
            raise ValueError("item is already queued")
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        key = tenant if self.config.tenant_fairness else NO_TENANT
        queue = cls.queues.get(key)
        if queue is None:  # becomes active: lifted to the virtual time, no credit banked while empty
            if not cls.queues:
                cls.pass_ = max(cls.pass_, self._vtime)
            weight = self.config.tenant_weights.get(key, 1.0)
            queue = _Queue(key, 1 / Fraction(weight), max(cls.idle_passes.pop(key, cls.vtime), cls.vtime))
            cls.queues[key] = queue
        ticket = self._next_ticket
        self._next_ticket += 1
        entry = _Entry(ticket, item, request_class, tenant, priority, num_slots, queue)
        queue.entries[ticket] = entry
        queue.head = None
        self._entries[item] = entry
        return ticket

    def remove(self, item: T) -> bool:
        """Drop a waiter that gave up (timeout, client gone); False if it was no longer queued."""
        entry = self._entries.get(item)
        if entry is None:
            return False
        self._drop(entry)
        return True

    def waiting_by_class(self) -> dict[str, int]:
        return {c: sum(len(q.entries) for q in cls.queues.values()) for c, cls in self._classes.items()}

    def has_waiting(self, request_class: str) -> bool:
        return bool(self._class(request_class).queues)

    def admit_round(self, try_admit: Callable[[T], bool], *, free_slots: int,
                    running_by_tenant: Mapping[str, int], batch_slots: int | None = None) -> list[T]:
        """Admit whoever may and fits now; returns the admitted items in admission order.

        ``try_admit(item)`` must admit atomically and return True, or change nothing and return False.
        ``batch_slots``: slots batch work may still take (rule 3); None: as many as are free.
        """
        rnd: _Round[T] = _Round(free_slots, dict(running_by_tenant),
                                free_slots if batch_slots is None else batch_slots)
        admitted: list[T] = []
        for holder in sorted(self._holders, key=lambda e: e.ticket):  # rule 4: they reserve capacity
            if not (self._eligible(holder, rnd) and try_admit(holder.item)):
                return admitted
            self._admit(holder, rnd, admitted)
        k = self.config.max_overtakes
        while (choice := self._choose(rnd)) is not None:
            queue, entry = choice
            window = rnd.windows.get(queue)
            if window is not None:
                window.popleft()  # behind a blocked head: tried once this round, admitted or not
            if try_admit(entry.item):
                self._admit(entry, rnd, admitted)
                if self._holders:
                    break  # a blocked head was overtaken K times
            elif window is None:  # the queue's head: blocked
                entry.blocked = True
                rnd.blocked_heads.append(entry)
                if entry.overtaken >= k:  # K == 0
                    self._holders.add(entry)
                    break
                behind = heapq.nsmallest(k + 1, queue.entries.values(), key=self._order)[1:]
                rnd.windows[queue] = deque(behind)
        for cls in self._classes.values():  # an emptied queue's pass matters only while ahead of vtime
            cls.idle_passes = {t: p for t, p in cls.idle_passes.items() if p > cls.vtime}
        return admitted

    # --- the decisions --------------------------------------------------------------------------------

    def _class(self, request_class: str) -> _Class[T]:
        cls = self._classes.get(request_class)
        if cls is None:
            raise ValueError(f"request class {request_class!r} is not one of {', '.join(REQUEST_CLASSES)}")
        return cls

    def _order(self, entry: _Entry[T]) -> tuple[int, int, int]:  # rule 1: aged by ticket, then priority
        if entry.passed >= self.config.aging_admissions:
            return (0, 0, entry.ticket)
        return (1, entry.priority, entry.ticket)

    def _eligible(self, entry: _Entry[T], rnd: _Round[T]) -> bool:  # rule 3
        cfg = self.config
        cap = cfg.tenant_max_running
        if cfg.tenant_fairness and cap is not None and rnd.running.get(entry.tenant, 0) >= cap:
            return False
        return entry.request_class == INTERACTIVE or entry.num_slots <= min(rnd.free_slots, rnd.batch_slots)

    def _choose(self, rnd: _Round[T]) -> tuple[_Queue[T], _Entry[T]] | None:
        """The next candidate in fair order (rule 2): the class, then the queue, whose next pass is lowest."""
        best: tuple[Fraction, _Queue[T], _Entry[T]] | None = None
        for cls in self._classes.values():
            pick: tuple[_Queue[T], _Entry[T]] | None = None
            for queue in cls.queues.values():
                if queue in rnd.done:
                    continue
                window = rnd.windows.get(queue)
                entry = self._head(queue) if window is None else (window[0] if window else None)
                if entry is None or not self._eligible(entry, rnd):
                    rnd.done.add(queue)
                    if window is None:
                        rnd.skipped.add(queue)
                elif pick is None or (queue.pass_ + queue.stride, queue.tenant) < (
                        pick[0].pass_ + pick[0].stride, pick[0].tenant):
                    pick = (queue, entry)
            if pick is not None and (best is None or cls.pass_ + cls.stride < best[0]):
                best = (cls.pass_ + cls.stride, *pick)
        return None if best is None else best[1:]

    def _head(self, queue: _Queue[T]) -> _Entry[T]:
        if queue.head is None:
            queue.head = min(queue.entries.values(), key=self._order)
        return queue.head

    def _admit(self, entry: _Entry[T], rnd: _Round[T], admitted: list[T]) -> None:
        cls, queue = self._classes[entry.request_class], entry.queue
        self._vtime = max(self._vtime, cls.pass_)
        cls.vtime = max(cls.vtime, queue.pass_)
        cls.pass_ += cls.stride
        queue.pass_ += queue.stride
        for other in self._classes.values():  # rule 2: skipped by rule 3, so lifted: no credit banked
            if other.queues and all(q in rnd.skipped for q in other.queues.values()):
                other.pass_ = max(other.pass_, self._vtime)
        for q in cls.queues.values():
            if q in rnd.skipped:
                q.pass_ = max(q.pass_, cls.vtime)
        for e in queue.entries.values():  # rule 1: admitted ahead of every older entry of its queue
            if e.ticket >= entry.ticket:
                break
            e.passed += 1
        for head in rnd.blocked_heads:  # rule 4
            head.overtaken += 1
            if head.overtaken >= self.config.max_overtakes:
                self._holders.add(head)
        self._drop(entry)
        rnd.free_slots -= entry.num_slots
        if entry.request_class != INTERACTIVE:
            rnd.batch_slots -= entry.num_slots
        rnd.running[entry.tenant] = rnd.running.get(entry.tenant, 0) + 1
        admitted.append(entry.item)

    def _drop(self, entry: _Entry[T]) -> None:
        queue = entry.queue
        del queue.entries[entry.ticket]
        del self._entries[entry.item]
        self._holders.discard(entry)
        queue.head = None
        if not queue.entries:
            cls = self._classes[entry.request_class]
            del cls.queues[queue.tenant]
            if queue.pass_ > cls.vtime:
                cls.idle_passes[queue.tenant] = queue.pass_
