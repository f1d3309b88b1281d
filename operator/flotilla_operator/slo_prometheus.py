"""The SLO scaler's window on Prometheus: a model's latency percentiles and attainment over `windowSeconds`.

One PromQL expression (parts joined with `or`, so they are read at one instant): each target's percentile by
`histogram_quantile` over the servers' bucket rates summed pool-wide, the first tokens in the window, and the
buckets' increases, from which `fraction_within` reads the attainment (the share of requests, or of tokens,
within the target) the way histogram_quantile reads a percentile: linearly inside a bucket. Failures are the
queue query's `PrometheusError`s (prometheus.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flotilla_contract.metrics import INTER_TOKEN_LATENCY_SECONDS, TIME_TO_FIRST_TOKEN_SECONDS

from flotilla_operator.prometheus import (
    PrometheusClient,
    bad_shape,
    labelled_union,
    model_selector,
    vector_rows,
)
from flotilla_operator.slo_scaler import SloTargets

Buckets = tuple[tuple[float, float], ...]  # (upper bound `le`, cumulative count), ascending; +Inf last


@dataclass(frozen=True)
class LatencyReading:
    """What the query found; None where no series had two samples in the window (nothing to rate)."""

    requests: float | None  # first tokens in the window, pool-wide
    ttft_s: float | None = None  # the percentile; None also when the window holds no first token (NaN)
    tpot_s: float | None = None
    ttft_buckets: Buckets = ()
    tpot_buckets: Buckets = ()


def latency_query(namespace: str, model: str, slo: SloTargets) -> str:
    selector = model_selector(namespace, model)
    window = f"[{slo.window_s:g}s]"
    parts = [("requests", f"sum(increase({TIME_TO_FIRST_TOKEN_SECONDS}_count{selector}{window}))")]
    for name, metric, target, percentile in (("ttft", TIME_TO_FIRST_TOKEN_SECONDS, slo.ttft_s, slo.ttft_percentile),
                                              ("tpot", INTER_TOKEN_LATENCY_SECONDS, slo.tpot_s, slo.tpot_percentile)):
        if target is None:
            continue
        buckets = f"sum by (le) (increase({metric}_bucket{selector}{window}))"
        parts += [(name, f"histogram_quantile({percentile:g}, {buckets})"), (f"{name}_bucket", buckets)]
    return labelled_union(parts)


def parse_latency(body: object) -> LatencyReading:
    try:
        values: dict[str, float] = {}
        buckets: dict[str, list[tuple[float, float]]] = {"ttft_bucket": [], "tpot_bucket": []}
        for row in vector_rows(body):
            part, value = row["metric"]["part"], float(row["value"][1])
            if part in buckets:
                buckets[part].append((float(row["metric"]["le"]), value))
            else:
                values[part] = value
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise bad_shape(body, e) from e

    def percentile(name: str) -> float | None:
        value = values.get(name)
        return value if value is not None and math.isfinite(value) else None  # NaN: no observation to rank

    return LatencyReading(values.get("requests"), percentile("ttft"), percentile("tpot"),
                          tuple(sorted(buckets["ttft_bucket"])), tuple(sorted(buckets["tpot_bucket"])))


def fraction_within(buckets: Buckets, target_s: float) -> float | None:
    """The share of observations at or under `target_s`, interpolated linearly inside its bucket (as
    histogram_quantile assumes); None with no observation. A target past the top finite bucket reads that
    bucket's share: the histogram cannot tell more."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if target_s <= le:
            if math.isinf(le):
                return lower_count / total
            share = (target_s - lower_le) / (le - lower_le) if le > lower_le else 1.0
            return (lower_count + share * (count - lower_count)) / total
        lower_le, lower_count = le, count
    return lower_count / total


async def measure_latency(prometheus: PrometheusClient, namespace: str, model: str, slo: SloTargets) -> LatencyReading:
    """The model's latency over the SLO's window (PrometheusError on failure)."""
    return parse_latency(await prometheus.query(latency_query(namespace, model, slo)))
