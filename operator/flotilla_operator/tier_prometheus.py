"""The tier decision's window on Prometheus: a model's demand over the last window as samples, the pool's
evictions of it, its SLO attainment, and the demand of the pool's other members.

Why Prometheus and not memory: an operator restart or a leader change must not cost the decision its history
(a new leader would otherwise gather `windowSeconds` before deciding again), so the samples are read back as a
subquery over the window at every tick. Demand counts the model's requests wherever they are (its dedicated
servers' and its pool's series both carry `model`), plus those the gateways hold for it, in replicas' worth of
its own slots (spec.server.maxNumSeqs).
"""

from __future__ import annotations

import math

from flotilla_contract.metrics import (
    GATEWAY_REQUESTS_HELD,
    MODEL_EVICTIONS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
)

from flotilla_operator.pool_prometheus import pool_selector
from flotilla_operator.prometheus import PrometheusClient, bad_shape, model_selector, vector_rows
from flotilla_operator.slo_prometheus import LatencyReading, fraction_within
from flotilla_operator.slo_status import SloTargets
from flotilla_operator.tiering import TierSample


def _held_selector(namespace: str, model: str) -> str:
    return model_selector(namespace, model).replace("namespace=", "model_namespace=", 1)


def demand_query(namespace: str, model: str, slots_per_replica: int, window_s: float, step_s: float) -> str:
    """The model's demand in replicas' worth of slots at every `step_s` of the last `window_s` (a subquery, one
    step longer than the window, so that its first point is at or before the window's start)."""
    servers = model_selector(namespace, model)
    now = (f"(sum({REQUESTS_RUNNING}{servers}) + sum({REQUESTS_WAITING}{servers})"
           f" + (sum({GATEWAY_REQUESTS_HELD}{_held_selector(namespace, model)}) or vector(0)))")
    step = max(int(step_s), 1)
    return f"({now} / {max(slots_per_replica, 1)})[{int(window_s) + step}s:{step}s]"


def evictions_query(namespace: str, model: str, window_s: float) -> str:
    return f"sum(increase({MODEL_EVICTIONS}_total{model_selector(namespace, model)}[{int(window_s)}s]))"


def pool_demand_query(namespace: str, pool: str, model: str, slots_per_replica: int) -> str:
    """The pool's other members' demand now, in replicas' worth of the pool's slots."""
    servers = pool_selector(namespace, pool)[:-1] + f',model!="{model}"}}'
    return (f"(sum({REQUESTS_RUNNING}{servers}) + sum({REQUESTS_WAITING}{servers})) / "
            f"{max(slots_per_replica, 1)}")


def parse_series(body: object) -> list[tuple[float, float]]:
    """The (time, value) points of a subquery's single series; none when the series is absent."""
    try:
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ValueError("status is not success")
        data = body["data"]
        if data["resultType"] != "matrix":
            raise ValueError(f"resultType {data['resultType']!r} is not matrix")
        points = [(float(t), float(v)) for series in data["result"] for t, v in series["values"]]
    except (KeyError, TypeError, ValueError) as error:
        raise bad_shape(body, error) from error
    return sorted(p for p in points if math.isfinite(p[1]))


def parse_scalar(body: object) -> float:
    """The first value of an instant vector; 0 when it is empty (no series: nothing happened)."""
    try:
        rows = vector_rows(body)
        return float(rows[0]["value"][1]) if rows else 0.0
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise bad_shape(body, error) from error


def attainment(reading: LatencyReading | None, slo: SloTargets | None) -> float | None:
    """The worse of the TTFT and TPOT attainments over the SLO's window (the share within target); None
    without an SLO or without requests."""
    if reading is None or slo is None:
        return None
    shares = [fraction_within(buckets, target) for buckets, target in
              ((reading.ttft_buckets, slo.ttft_s), (reading.tpot_buckets, slo.tpot_s)) if target is not None]
    known = [s for s in shares if s is not None]
    return min(known) if known else None


async def read_samples(prometheus: PrometheusClient, namespace: str, model: str, slots_per_replica: int,
                       window_s: float, step_s: float, latest_attainment: float | None) -> tuple[TierSample, ...]:
    """The window's samples, oldest first. The pool's evictions of the model over the window and the
    attainment ride on the newest sample (decide_tier sums the one and averages the other over the window).
    Raises PrometheusError."""
    points = parse_series(await prometheus.query(demand_query(namespace, model, slots_per_replica, window_s, step_s)))
    if not points:
        return ()
    evictions = parse_scalar(await prometheus.query(evictions_query(namespace, model, window_s)))
    samples = [TierSample(at_s, demand) for at_s, demand in points]
    samples[-1] = TierSample(points[-1][0], points[-1][1], latest_attainment, round(evictions))
    return tuple(samples)


async def read_pool_demand(prometheus: PrometheusClient, namespace: str, pool: str, model: str,
                           slots_per_replica: int) -> float:
    return parse_scalar(await prometheus.query(pool_demand_query(namespace, pool, model, slots_per_replica)))
