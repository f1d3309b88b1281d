"""The SLO scaler's inputs from the spec and Prometheus, and its memory and figures in status.

As with the queue-depth rule (autoscaler_status.py), what the SLO scaler remembers lives in
`status.autoscaler.slo`, so an operator restart neither forgets a scale-down window nor the last time new
replicas became ready. `status.slo` shows what was measured, for people and for dashboards.
"""

from __future__ import annotations

from typing import Any

from flotilla_contract.metrics import TIME_TO_FIRST_TOKEN_SECONDS

from flotilla_operator import types
from flotilla_operator.autoscaler import REASON_METRICS_UNAVAILABLE
from flotilla_operator.autoscaler_status import read_recommendations, written_recommendations
from flotilla_operator.rfc3339 import format_time, parse_time
from flotilla_operator.slo_prometheus import LatencyReading, fraction_within
from flotilla_operator.slo_scaler import REASON_NOT_MEASURED, LatencySample, SloDecision, SloState, SloTargets


def slo_targets(spec: types.InferenceModelSpec) -> SloTargets | None:
    slo = spec.slo
    if slo is None:
        return None
    return SloTargets(ttft_s=slo.ttft_seconds, tpot_s=slo.tpot_seconds, ttft_percentile=slo.ttft_percentile,
                      tpot_percentile=slo.tpot_percentile, window_s=float(slo.window_seconds))


def latency_observation(reading: LatencyReading | None, window_s: float,
                        ready_replicas: int) -> tuple[LatencySample | None, str, str]:
    """What the SLO scaler sees, and if nothing, the reason and why. No series to rate while replicas are ready
    means no measurement: a window shorter than two of Prometheus' scrapes, or servers that export no latency
    histogram. With none ready, a model at zero has simply served nothing."""
    if reading is None:
        return None, REASON_METRICS_UNAVAILABLE, "the Prometheus query failed"
    if reading.requests is None:
        if ready_replicas == 0:
            return LatencySample(0.0), "", ""
        return None, REASON_NOT_MEASURED, (
            f"no {TIME_TO_FIRST_TOKEN_SECONDS} series has two samples in the last {window_s:g}s: raise "
            "slo.windowSeconds to at least two of Prometheus' scrape intervals, or check that the servers export it")
    return LatencySample(reading.requests, reading.ttft_s, reading.tpot_s), "", ""


def _time(text: Any) -> float | None:
    try:
        return parse_time(text) if isinstance(text, str) and text else None
    except ValueError:
        return None


def state_from_status(autoscaler_status: dict[str, Any] | None) -> SloState:
    """The remembered state; entries that cannot be read are dropped rather than failing the loop."""
    status = (autoscaler_status or {}).get("slo") or {}
    ready = status.get("readyReplicas")
    return SloState(read_recommendations(status.get("recommendations")), int(ready) if isinstance(ready, int) else None,
                    _time(status.get("readyGrewAt")), _time(status.get("scaledDownAt")))


def state_patch(state: SloState) -> dict[str, Any]:
    """`status.autoscaler.slo` holding `state`."""
    def stamp(t: float | None) -> str | None:
        return format_time(t) if t is not None else None

    return {"recommendations": written_recommendations(state.recommendations),
            "readyReplicas": state.ready_seen, "readyGrewAt": stamp(state.ready_grew_at_s),
            "scaledDownAt": stamp(state.scaled_down_at_s)}


def figures(slo: SloTargets, reading: LatencyReading | None, decision: SloDecision, now_s: float) -> dict[str, Any]:
    """`status.slo`: the measured percentiles and attainment over the window (None where nothing was measured)."""
    reading = reading or LatencyReading(None)

    def rounded(value: float | None, digits: int = 4) -> float | None:
        return round(value, digits) if value is not None else None

    out: dict[str, Any] = {"requests": rounded(reading.requests, 1), "windowSeconds": int(slo.window_s),
                           "signal": rounded(decision.signal), "observedAt": format_time(now_s)}
    if slo.ttft_s is not None:
        out["ttftSeconds"] = rounded(reading.ttft_s)
        out["ttftAttainment"] = rounded(fraction_within(reading.ttft_buckets, slo.ttft_s))
    if slo.tpot_s is not None:
        out["tpotSeconds"] = rounded(reading.tpot_s)
        out["tpotAttainment"] = rounded(fraction_within(reading.tpot_buckets, slo.tpot_s))
    return out

