"""An adaptive model's tier as its status records it, and the children that follow from it.

Why status: a move spans minutes and the operator may restart in the middle of one, so where the model is
(status.tier), since when (status.tierSince) and the move in flight (status.move) are written there, and every
reconciler reads the children they imply from there, through `model_children`: the pool's members file, the
model's Deployment and Service, status.pool (what the gateway routes by). A model never tiered yet starts in its
pool, as a cost-first member would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flotilla_operator import rfc3339
from flotilla_operator.placement import ADAPTIVE, COST_FIRST
from flotilla_operator.tier_moves import Children, Move, children, settled
from flotilla_operator.tiering import POOL
from flotilla_operator.types import InferenceModelSpec


@dataclass(frozen=True)
class TierState:
    tier: str
    since_s: float  # -inf: never moved
    move: Move | None


def read_state(status: Mapping[str, Any] | None) -> TierState:
    """The tier, its start and the move in flight, as status recorded them; a move that cannot be read is
    dropped (the model is where status.tier says, and the next decision starts again)."""
    status = status or {}
    tier = status.get("tier") or POOL
    since = status.get("tierSince")
    since_s = rfc3339.parse_time(since) if since else -math.inf
    move = None
    recorded = status.get("move")
    if isinstance(recorded, Mapping):
        try:
            move = Move(to=recorded["to"], phase=recorded["phase"],
                        phase_since_s=rfc3339.parse_time(recorded["phaseSince"]),
                        replicas=int(recorded.get("replicas") or 1), reason=recorded.get("reason") or "")
        except (KeyError, TypeError, ValueError):
            move = None
    return TierState(tier if tier in ("pool", "dedicated") else POOL, since_s, move)


def move_status(move: Move | None) -> dict[str, Any] | None:
    """status.move for `move`; None removes it (a merge patch)."""
    if move is None:
        return None
    return {"to": move.to, "phase": move.phase, "phaseSince": rfc3339.format_time(move.phase_since_s),
            "replicas": move.replicas, "reason": move.reason}


def model_children(spec: InferenceModelSpec, status: Mapping[str, Any] | None, dedicated_replicas: int) -> Children:
    """Pool membership, dedicated replicas and route of any model naming a pool or not:
    cost-first with a pool is a member; adaptive follows its status; every other model is on its own replicas."""
    if spec.pool is not None and spec.placement.policy == ADAPTIVE:
        state = read_state(status)
        return children(state.tier, state.move, dedicated_replicas)
    if spec.pool is not None and spec.placement.policy == COST_FIRST:
        return settled(POOL, dedicated_replicas)
    return Children(pool_member=False, dedicated_replicas=dedicated_replicas, routed_to_pool=False)
