"""A tier move of a `placement.policy: adaptive` model, make-before-break: the pure state machine that carries
decide_tier's answer out (tiering.py decides where; this says how to get there without dropping a request).

Why a state machine of its own, kept in status: a move spans minutes (pods start, a pool loads, endpoints
propagate, in-flight requests drain), the operator may restart or lose its lease in the middle, and the model
must be served from one tier or the other at every instant. So each step is a function of the move as status
recorded it and of what is observed now, and its answer says what the children should be (pool membership,
dedicated replicas, which tier the gateway routes to: `status.pool`); the operator's handler (not built yet)
writes them and the next status. A restart then resumes from status.move, and a rollback is the same function's
answer to a timeout.

Phases (issue 37, part 4):

    promotion (pool -> dedicated)            demotion (dedicated -> pool)
    STARTING  the Deployment is created,     LOADING   the pool is handed the model (it loads it) while the
              sized for the demand, while              dedicated replicas keep serving, until the pool
              the pool keeps serving, until            reports it loaded
              `replicas` are ready
    SWITCHING the gateway routes to the      SWITCHING the gateway routes to the pool (status.pool set);
              Deployment (status.pool                  held for `switch_grace_s`
              cleared); held for
              `switch_grace_s` (endpoints and
              gateway watches catch up)
    DRAINING  the pool member is removed:    DRAINING  the Deployment goes to 0 (its pods drain on SIGTERM)
              the pool takes no new requests           until no pod is left
              for it, finishes what it has and
              unloads it, until it reports it
              unloaded or `drain_timeout_s`

Rules:
- the tier that serves is the source until SWITCHING, the target from then: the route changes only once the
  target is ready, so the model is never served from neither tier;
- STARTING or LOADING past `start_timeout_s` rolls back, and LOADING at once when the pool refuses the model
  (its memory budget cannot hold it): the target's children are removed, the tier stays,
  and the answer carries a Degraded reason (pods unschedulable, a load that never finishes);
- once the route has switched there is no rollback: DRAINING only waits, up to `drain_timeout_s` for a pool
  that does not report the unload or pods that do not go (the source's children are gone from the spec
  either way);
- every phase change is an Event with its reason, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flotilla_operator.tiering import DEDICATED, POOL, TIERS

STARTING = "Starting"
LOADING = "Loading"
SWITCHING = "Switching"
DRAINING = "Draining"
PHASES = (STARTING, LOADING, SWITCHING, DRAINING)

# Event reasons, in the order a move writes them
REASON_PROMOTION_STARTED = "PromotionStarted"
REASON_DEMOTION_STARTED = "DemotionStarted"
REASON_ROUTE_SWITCHED = "TierRouteSwitched"
REASON_DRAINING = "TierDraining"
REASON_MOVE_DONE = "TierMoved"
REASON_ROLLED_BACK = "TierMoveRolledBack"
# Degraded reasons of a rolled-back move
DEGRADED_PROMOTION_FAILED = "PromotionFailed"
DEGRADED_DEMOTION_FAILED = "DemotionFailed"


@dataclass(frozen=True)
class MoveTimings:
    start_timeout_s: float = 600.0  # STARTING or LOADING longer than this rolls back
    switch_grace_s: float = 10.0  # the route change reaches the gateways and endpoints
    drain_timeout_s: float = 300.0  # the source's in-flight requests finish (the server's drain bound)


@dataclass(frozen=True)
class Move:
    """status.move: a move in flight."""

    to: str  # DEDICATED (a promotion) or POOL (a demotion)
    phase: str
    phase_since_s: float
    replicas: int = 1  # a promotion's Deployment size, from the demand when it started
    reason: str = ""  # decide_tier's reason for it

    def __post_init__(self) -> None:
        if self.to not in TIERS or self.phase not in PHASES or self.replicas < 1:
            raise ValueError(f"not a move: to {self.to!r}, phase {self.phase!r}, replicas {self.replicas}")


@dataclass(frozen=True)
class Seen:
    """What the operator observes of the model's two tiers now."""

    dedicated_ready: int  # ready replicas of its Deployment
    dedicated_pods: int  # pods of its Deployment, ready or not (0: drained)
    pool_loaded: bool  # the pool's servers report the model loaded and ready
    pool_refusal: str | None = None  # why the pool cannot load the model (its budget cannot hold it); None: it can


@dataclass(frozen=True)
class Children:
    """What the model's children should be: the shells make them so."""

    pool_member: bool  # listed in the pool's members (the pool loads it and serves it)
    dedicated_replicas: int  # its Deployment's replicas (0: scaled away)
    routed_to_pool: bool  # status.pool set: the gateway routes to the pool, else to the Deployment


@dataclass(frozen=True)
class Step:
    tier: str  # the tier the model is in (status.tier): the source until the move is done
    move: Move | None  # the move still in flight; None: done, rolled back, or none
    children: Children
    event: tuple[str, str] | None = None  # (reason, message) of a phase change
    degraded: str | None = None  # the Degraded reason of a rolled-back move


def children(tier: str, move: Move | None, dedicated_replicas: int) -> Children:
    """What the children of a model in `tier` should be, at rest (`move` None) or during `move`;
    `dedicated_replicas`: the replicas its Deployment has now (the autoscaler's answer)."""
    return settled(tier, dedicated_replicas) if move is None else _during(move, dedicated_replicas)


def settled(tier: str, dedicated_replicas: int) -> Children:
    """The children of a model at rest in `tier` (`dedicated_replicas`: its autoscaler's answer)."""
    if tier == POOL:
        return Children(pool_member=True, dedicated_replicas=0, routed_to_pool=True)
    return Children(pool_member=False, dedicated_replicas=max(dedicated_replicas, 1), routed_to_pool=False)


def start(tier: str, reason: str, replicas: int, now_s: float) -> Step:
    """A move out of `tier` for decide_tier's `reason`; `replicas`: a promotion's Deployment size."""
    if tier == POOL:
        move = Move(DEDICATED, STARTING, now_s, max(replicas, 1), reason)
        event = (REASON_PROMOTION_STARTED, f"{reason}: creating {move.replicas} dedicated replica(s); the pool "
                                           "serves until they are ready")
        return Step(POOL, move, Children(True, move.replicas, True), event)
    move = Move(POOL, LOADING, now_s, 1, reason)
    event = (REASON_DEMOTION_STARTED, f"{reason}: the pool loads the model; the dedicated replicas serve until it "
                                      "is ready")
    return Step(DEDICATED, move, Children(True, max(replicas, 1), False), event)


def advance(tier: str, move: Move, seen: Seen, now_s: float, timings: MoveTimings = MoveTimings()) -> Step:
    """The next step of `move` out of `tier`, given what is seen now."""
    waited_s = now_s - move.phase_since_s
    promotion = move.to == DEDICATED
    if move.phase in (STARTING, LOADING):
        target_ready = seen.dedicated_ready >= move.replicas if promotion else seen.pool_loaded
        if not promotion and not target_ready and seen.pool_refusal is not None:
            return Step(tier, None, settled(tier, seen.dedicated_pods),
                        (REASON_ROLLED_BACK, f"{seen.pool_refusal}: the model stays in the {tier} tier"),
                        DEGRADED_DEMOTION_FAILED)
        if target_ready:
            switched = replace(move, phase=SWITCHING, phase_since_s=now_s)
            where = f"{seen.dedicated_ready} dedicated replica(s)" if promotion else "the pool"
            return Step(tier, switched, _during(switched, seen.dedicated_pods),
                        (REASON_ROUTE_SWITCHED, f"the gateway now routes to {where}"))
        if waited_s > timings.start_timeout_s:
            what = (f"{seen.dedicated_ready} of {move.replicas} dedicated replica(s) ready" if promotion
                    else "the pool has not loaded the model")
            degraded = DEGRADED_PROMOTION_FAILED if promotion else DEGRADED_DEMOTION_FAILED
            return Step(tier, None, settled(tier, seen.dedicated_pods),
                        (REASON_ROLLED_BACK, f"after {waited_s:.0f} s {what}: the model stays in the {tier} tier"),
                        degraded)
        return Step(tier, move, _during(move, seen.dedicated_pods))
    if move.phase == SWITCHING:
        if waited_s < timings.switch_grace_s:
            return Step(tier, move, _during(move, seen.dedicated_pods))
        draining = replace(move, phase=DRAINING, phase_since_s=now_s)
        source = "pool member" if promotion else "dedicated replicas"
        return Step(tier, draining, _during(draining, seen.dedicated_pods),
                    (REASON_DRAINING, f"the {source} take no new requests and finish what they have"))
    drained = (not seen.pool_loaded) if promotion else seen.dedicated_pods == 0
    if drained or waited_s > timings.drain_timeout_s:
        return Step(move.to, None, settled(move.to, move.replicas),
                    (REASON_MOVE_DONE, f"now in the {move.to} tier"))
    return Step(tier, move, _during(move, seen.dedicated_pods))


def _during(move: Move, dedicated_replicas: int) -> Children:
    """The children while `move` is in its phase: both tiers up until the source drains; the route with the
    source until SWITCHING, with the target from then."""
    promotion = move.to == DEDICATED
    switched = move.phase in (SWITCHING, DRAINING)
    routed_to_pool = (not promotion) if switched else promotion
    if promotion:
        return Children(move.phase != DRAINING, move.replicas, routed_to_pool)
    return Children(True, 0 if move.phase == DRAINING else max(dedicated_replicas, 1), routed_to_pool)
