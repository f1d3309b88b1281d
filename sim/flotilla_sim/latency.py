"""What Prometheus would answer about each model's latency: windowed histograms and histogram_quantile.

The SLO policies (slo_policies.py) decide on a percentile of the servers' TTFT and inter-token histograms
over a window, as the operator reads them from Prometheus (flotilla_operator.slo_prometheus). So the
simulator keeps, per model, the same histograms (the buckets of flotilla_contract.metrics) over time, and
reads them as Prometheus does: `histogram_quantile` interpolates linearly inside the bucket holding the
rank, returns the top finite bucket's bound past it, and NaN on an empty window. Two keepers, one per
fidelity: `TickWindow` (fluid: per-tick count arrays over the catalogue) and `EventWindow` (request level:
time-stamped observations).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from flotilla_contract.metrics import ITL_BUCKETS_S, LATENCY_BUCKETS_S

TTFT_BOUNDS = np.array(LATENCY_BUCKETS_S)
ITL_BOUNDS = np.array(ITL_BUCKETS_S)


def bucket_of(values, bounds: np.ndarray):
    """The bucket each value falls in: i for bounds[i-1] < v <= bounds[i] (`le`), len(bounds) for +Inf."""
    return np.searchsorted(bounds, values, side="left")


def histogram_quantile(q: float, counts: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Prometheus' histogram_quantile over per-bucket (not cumulative) counts [..., len(bounds) + 1]."""
    counts = np.atleast_2d(counts)
    cumulative = np.cumsum(counts, axis=-1)
    total = cumulative[..., -1]
    rank = q * total
    finite = cumulative[..., :-1] >= rank[..., None]
    b = np.where(finite.any(axis=-1), finite.argmax(axis=-1), len(bounds))
    below = np.where(b > 0, np.take_along_axis(cumulative, np.maximum(b - 1, 0)[..., None], -1)[..., 0], 0.0)
    inside = np.take_along_axis(counts, np.minimum(b, len(bounds))[..., None], -1)[..., 0]
    start = np.where(b > 0, bounds[np.maximum(b - 1, 0)], 0.0)
    end = bounds[np.minimum(b, len(bounds) - 1)]
    with np.errstate(invalid="ignore", divide="ignore"):
        value = start + (end - start) * (rank - below) / inside
    value = np.where(b >= len(bounds), bounds[-1], value)  # past the top finite bucket: its bound
    return np.where(total > 0, value, np.nan)


@dataclass(frozen=True)
class LatencyView:
    """One scrape's answer for every model: bucket counts of the window (TTFT per request, ITL per token)."""

    ttft_counts: np.ndarray  # [models, len(TTFT_BOUNDS) + 1]
    itl_counts: np.ndarray  # [models, len(ITL_BOUNDS) + 1]

    @property
    def requests(self) -> np.ndarray:
        return self.ttft_counts.sum(axis=1)

    def ttft_s(self, q: float) -> np.ndarray:
        """Each model's TTFT at quantile q over the window; NaN where it holds no first token."""
        return histogram_quantile(q, self.ttft_counts, TTFT_BOUNDS)

    def tpot_s(self, q: float) -> np.ndarray:
        return histogram_quantile(q, self.itl_counts, ITL_BOUNDS)


def _bincount(models: np.ndarray, buckets: np.ndarray, weights: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    flat = np.bincount((models * shape[1] + buckets).ravel(), weights=weights.ravel(), minlength=shape[0] * shape[1])
    return flat.reshape(shape)


class TickWindow:
    """Fluid mode: each tick's counts per model, summed over the last `window_s` (summed afresh at each view: a
    running sum would leave rounding residue in buckets long emptied, which reads as a phantom percentile)."""

    def __init__(self, num_models: int, tick_s: float, window_s: float) -> None:
        self.models = num_models
        self.shapes = ((num_models, len(TTFT_BOUNDS) + 1), (num_models, len(ITL_BOUNDS) + 1))
        self.recent: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=max(math.ceil(window_s / tick_s - 1e-9), 1))

    def add_tick(self, ttft_s: np.ndarray, ttft_weights: np.ndarray, itl_s: np.ndarray, itl_weights: np.ndarray) -> None:
        """`ttft_s` and its weights are [points, models] (requests at each value); `itl_s` [models] with the
        tokens decoded at that gap."""
        models = np.broadcast_to(np.arange(self.models), ttft_s.shape)
        ttft = _bincount(models, bucket_of(ttft_s, TTFT_BOUNDS), ttft_weights, self.shapes[0])
        itl = _bincount(np.arange(self.models), bucket_of(itl_s, ITL_BOUNDS), itl_weights, self.shapes[1])
        self.recent.append((ttft, itl))

    def view(self) -> LatencyView:
        if not self.recent:
            return LatencyView(np.zeros(self.shapes[0]), np.zeros(self.shapes[1]))
        return LatencyView(sum(t for t, _ in self.recent), sum(i for _, i in self.recent))


class EventWindow:
    """Request level: observations with their times; a view sums those in (end - window, end]."""

    def __init__(self, num_models: int, window_s: float) -> None:
        self.models, self.window_s = num_models, window_s
        self.times: list[float] = []
        self.rows: list[tuple[int, int, int, float]] = []  # (kind 0 TTFT / 1 ITL, model, bucket, count)

    def ttft(self, time_s: float, model: int, value_s: float) -> None:
        self._add(time_s, (0, model, int(bucket_of(value_s, TTFT_BOUNDS)), 1.0))

    def itl(self, time_s: float, model: int, value_s: float, tokens: float) -> None:
        if tokens > 0:
            self._add(time_s, (1, model, int(bucket_of(value_s, ITL_BOUNDS)), float(tokens)))

    def _add(self, time_s: float, row: tuple[int, int, int, float]) -> None:
        at = bisect.bisect_right(self.times, time_s)  # almost always the end: the clock only moves on
        self.times.insert(at, time_s)
        self.rows.insert(at, row)

    def view(self, end_s: float) -> LatencyView:
        lo = bisect.bisect_right(self.times, end_s - self.window_s)
        hi = bisect.bisect_right(self.times, end_s)
        ttft, itl = np.zeros((self.models, len(TTFT_BOUNDS) + 1)), np.zeros((self.models, len(ITL_BOUNDS) + 1))
        for kind, model, bucket, count in self.rows[lo:hi]:
            (ttft if kind == 0 else itl)[model, bucket] += count
        return LatencyView(ttft, itl)
