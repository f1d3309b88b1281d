"""The API of adaptive tiering (`placement.policy: adaptive`): `spec.tiering`'s parameters and the status fields a
move writes (docs/autoscaling.md, "Adaptive tiering").

Apart from types.py because the decision's parameters map one to one onto tiering.TieringSpec and the move's
onto tier_moves.MoveTimings, and the status is the move's durable memory: an operator restart resumes from it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from flotilla_operator import tier_moves, tiering

_DEFAULTS = tiering.TieringSpec()
_TIMINGS = tier_moves.MoveTimings()


class _ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class TieringSpec(_ApiModel):
    """When an adaptive model moves between its pool and dedicated replicas, and how long a move may take."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid",
        json_schema_extra={"x-kubernetes-validations": [
            {"rule": "self.demoteDemandReplicas < self.promoteDemandReplicas",
             "message": "tiering.demoteDemandReplicas must be less than tiering.promoteDemandReplicas (the gap is the "
                        "hysteresis)"},
            {"rule": "self.promoteAttainment <= self.demoteAttainment",
             "message": "tiering.promoteAttainment must not exceed tiering.demoteAttainment"},
        ]},
    )

    promote_demand_replicas: float = Field(
        _DEFAULTS.promote_demand_replicas, gt=0, le=1000,
        description="promoteDemandReplicas is the sustained demand, in replicas' worth of slots ((running + waiting) / "
        "server.maxNumSeqs), whose lower quartile over the window promotes the model to dedicated replicas.")
    demote_demand_replicas: float = Field(
        _DEFAULTS.demote_demand_replicas, ge=0, le=1000,
        description="demoteDemandReplicas is the demand whose upper quartile over the window, at or under it, demotes "
        "the model back to the pool; less than promoteDemandReplicas.")
    promote_attainment: float = Field(
        _DEFAULTS.promote_attainment, gt=0, le=1,
        description="promoteAttainment is the SLO attainment in the pool (spec.slo) under which a model with demand "
        "is promoted.")
    demote_attainment: float = Field(
        _DEFAULTS.demote_attainment, gt=0, le=1,
        description="demoteAttainment is the SLO attainment on its dedicated replicas needed before it is demoted.")
    promote_cold_loads_per_hour: float = Field(
        _DEFAULTS.promote_cold_loads_per_h, ge=0,
        description="promoteColdLoadsPerHour is how often the pool may evict a model with demand (each eviction costs "
        "a cold load on its return) before it is promoted; 0 turns the rule off.")
    pool_fill_limit: float = Field(
        _DEFAULTS.pool_fill_limit, gt=0, le=1,
        description="poolFillLimit bounds a demotion: the pool's demand with the model's must stay within this share "
        "of the pool's ready replicas.")
    window_seconds: int = Field(
        int(_DEFAULTS.window_s), ge=2, le=86400,
        description="windowSeconds is how much history the decision reads; none is taken before it is gathered.")
    min_stay_seconds: int = Field(
        int(_DEFAULTS.min_stay_s), ge=0, le=86400,
        description="minStaySeconds is the least time between moves of the model (a rolled-back move counts).")
    start_timeout_seconds: int = Field(
        int(_TIMINGS.start_timeout_s), ge=1, le=7200,
        description="startTimeoutSeconds bounds a move's first phase (dedicated replicas ready, or the pool loading "
        "the model); past it the move is rolled back and the model stays where it was, Degraded.")
    switch_grace_seconds: int = Field(
        int(_TIMINGS.switch_grace_s), ge=0, le=600,
        description="switchGraceSeconds is how long both tiers serve after the route changes, while gateways and "
        "endpoints catch up.")
    drain_timeout_seconds: int = Field(
        int(_TIMINGS.drain_timeout_s), ge=1, le=7200,
        description="drainTimeoutSeconds bounds the wait for the old tier to finish its requests and let go.")

    @model_validator(mode="after")
    def _ordered(self) -> TieringSpec:
        """What the CEL rules refuse, for specs that did not pass through the API server."""
        self.decision(max_moves_per_h=1)  # raises ValueError naming the fields
        return self

    def decision(self, max_moves_per_h: int) -> tiering.TieringSpec:
        return tiering.TieringSpec(
            promote_demand_replicas=self.promote_demand_replicas, demote_demand_replicas=self.demote_demand_replicas,
            promote_attainment=self.promote_attainment, demote_attainment=self.demote_attainment,
            promote_cold_loads_per_h=self.promote_cold_loads_per_hour, pool_fill_limit=self.pool_fill_limit,
            window_s=float(self.window_seconds), min_stay_s=float(self.min_stay_seconds),
            max_moves_per_h=max_moves_per_h)

    def timings(self) -> tier_moves.MoveTimings:
        return tier_moves.MoveTimings(start_timeout_s=float(self.start_timeout_seconds),
                                      switch_grace_s=float(self.switch_grace_seconds),
                                      drain_timeout_s=float(self.drain_timeout_seconds))


class MoveStatus(_ApiModel):
    to: Literal["pool", "dedicated"] = Field(description="to is the tier the model is moving to.")
    phase: Literal["Starting", "Loading", "Switching", "Draining"] = Field(
        description="phase is the move's step: Starting (dedicated replicas start) or Loading (the pool loads it), "
        "then Switching (the route has changed) and Draining (the old tier finishes and lets go).")
    phase_since: str = Field(description="phaseSince is when the phase began (RFC 3339).")
    replicas: int = Field(1, ge=1, description="replicas is a promotion's dedicated replicas.")
    reason: str = Field("", description="reason is the decision that started the move.")


class TierDegraded(_ApiModel):
    reason: str = Field(description="reason is PromotionFailed, DemotionFailed or PoolCannotHold.")
    message: str = Field("", description="message says what did not happen in time, and what to check.")


class TieringStatus(_ApiModel):
    last_decision: str | None = Field(None, description="lastDecision is the last decision with the numbers that drove it.")
    reason: str | None = Field(None, description="reason is the last decision's machine-readable reason.")
    demand_replicas: float | None = Field(
        None, description="demandReplicas is the demand quartile the decision read (lower in the pool, upper dedicated).")
    attainment: float | None = Field(None, description="attainment is the SLO attainment over the window, when spec.slo is set.")
    cold_loads_per_hour: float | None = Field(None, description="coldLoadsPerHour is the pool's evictions of the model, per hour.")
    observed_at: str | None = Field(None, description="observedAt is when the decision was taken (RFC 3339).")
    degraded: TierDegraded | None = Field(
        None, description="degraded is why the last move was rolled back; it stays until the next move starts.")
    moves: list[str] = Field(
        default_factory=list, description="moves are the start times of the model's moves in the last hour: the "
        "fleet-wide move budget (the operator's --tier-moves-per-hour) counts them across models.")
