"""The pool autoscaler's decision: `autoscaler.decide` over the pool's aggregate demand, above a memory floor.

A pool's replicas must hold every member that has demand, or the servers thrash (load, evict, load
again) however short the queue: four active models cannot share one replica that holds two. So the
floor is

    floor = ceil(memory of the members with requests in the last window ÷ budget per replica)

clamped to maxReplicas, and decide()'s answer is raised to it when short (docs/pools.md, "Scaling").
The demand is the pool's queue depth plus held requests, summed over its members, as decide() takes it.
Pure, like decide(): the kopf shell gathers the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from flotilla_operator import autoscaler

REASON_MEMORY_FLOOR = "MemoryFloor"


@dataclass(frozen=True)
class MemberDemand:
    model: str
    memory_bytes: int  # what the member holds when loaded (the server's figure, else modelMemory)
    last_request_age_s: float | None  # seconds since its last request; None: never, as far as anyone knows


def active_memory_bytes(members: Iterable[MemberDemand], window_s: float) -> int:
    """Memory of the members with a request in the last `window_s` seconds."""
    return sum(m.memory_bytes for m in members if m.last_request_age_s is not None and m.last_request_age_s <= window_s)


def memory_floor(active_bytes: int, budget_per_replica: int, max_replicas: int) -> int:
    """Replicas needed to hold `active_bytes` at once, at most `max_replicas`; 0 when nothing is active.

    A member bigger than one replica's budget still counts its whole size (the server refuses it; the
    floor does not pretend it fits).
    """
    if budget_per_replica <= 0:
        raise ValueError(f"the budget per replica must be positive, got {budget_per_replica} bytes; raise memoryBudget")
    if active_bytes <= 0:
        return 0
    return min(math.ceil(active_bytes / budget_per_replica), max_replicas)


def decide_pool(spec: autoscaler.ScalingSpec, floor: int, obs: autoscaler.Observation,
                state: autoscaler.AutoscalerState) -> autoscaler.Decision:
    """decide() on the pool's demand, raised to the memory floor when it falls short; such a decision says so.

    Like minReplicas, the floor is a bound, not a recommendation: no stabilization window delays it,
    and the remembered history stays decide()'s own, so the floor leaving lets demand alone decide again.
    """
    decision = autoscaler.decide(spec, obs, state)
    bound = min(floor, spec.max_replicas)
    if decision.reason != autoscaler.REASON_METRICS_UNAVAILABLE and decision.desired_replicas < bound:
        return replace(decision, desired_replicas=bound, reason=REASON_MEMORY_FLOOR,
                       message=f"the active members need {bound} replicas of memory; {decision.message}")
    return decision
