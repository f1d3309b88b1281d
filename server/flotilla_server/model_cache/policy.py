"""Which resident models to evict, if any, so that one more model fits the memory budget.

A pure function, apart from the thread that loads and the engines that serve, so that every rule is a
table and property test, and so that the fleet simulator runs this very code (docs/architecture.md,
"Model cache"). It imports nothing but the standard library.

Rules, each a lesson from a peer's failure:
- a model with requests running or waiting is never evicted (Ollama deadlocked evicting one in use);
- a model resident for less than `min_residency_s` is never evicted, so a pool cannot thrash;
- victims go least recently used first, and only as many as the new model needs (ModelMesh once emptied
  most of its cache for one load);
- a model larger than the whole budget is refused at once, never queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    LOAD = "load"  # fits now, after evicting `evict` (possibly none)
    WAIT = "wait"  # would fit once busy or young models become evictable
    REFUSE = "refuse"  # can never fit


# Reasons label the eviction counter and the log line; a small closed set.
REASON_FITS = "Fits"
REASON_EVICT_LRU = "EvictLeastRecentlyUsed"
REASON_BUSY = "VictimsBusy"
REASON_MIN_RESIDENCY = "MinimumResidency"
REASON_INFEASIBLE = "LargerThanBudget"


@dataclass(frozen=True)
class Resident:
    """A model that holds memory now: loaded, or being loaded (then `busy` is True: it has waiters)."""

    name: str
    memory_bytes: int
    loaded_at_s: float  # when its load finished (or started, while loading)
    last_used_s: float  # last time a request for it arrived or finished
    busy: bool  # requests running or waiting, or a load in progress


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    evict: tuple[str, ...] = ()  # names, least recently used first
    retry_after_s: float | None = None  # WAIT: seconds until a young model passes min residency; None: on idle


def evictable(model: Resident, now_s: float, min_residency_s: float) -> bool:
    return not model.busy and now_s - model.loaded_at_s >= min_residency_s


def decide_load(
    model_bytes: int,
    residents: list[Resident] | tuple[Resident, ...],
    budget_bytes: int,
    now_s: float,
    min_residency_s: float,
) -> Decision:
    """What to do to load a model of `model_bytes` beside `residents` within `budget_bytes`."""
    if model_bytes > budget_bytes:
        return Decision(Action.REFUSE, REASON_INFEASIBLE)
    free = budget_bytes - sum(r.memory_bytes for r in residents)
    if model_bytes <= free:
        return Decision(Action.LOAD, REASON_FITS)
    victims: list[str] = []
    lru_first = sorted(residents, key=lambda r: (r.last_used_s, r.name))
    for candidate in lru_first:
        if not evictable(candidate, now_s, min_residency_s):
            continue
        victims.append(candidate.name)
        free += candidate.memory_bytes
        if model_bytes <= free:
            return Decision(Action.LOAD, REASON_EVICT_LRU, tuple(victims))
    young = [r for r in residents if not r.busy and now_s - r.loaded_at_s < min_residency_s]
    if young:
        wait_s = min(min_residency_s - (now_s - r.loaded_at_s) for r in young)
        return Decision(Action.WAIT, REASON_MIN_RESIDENCY, retry_after_s=max(0.0, wait_s))
    return Decision(Action.WAIT, REASON_BUSY)
