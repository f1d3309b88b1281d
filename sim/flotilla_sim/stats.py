"""Latency distributions as log-spaced histograms, and the counters every run reports.

A fleet day serves ~10^10 requests; percentiles come from a histogram of 1.2%-wide bins between
1 ms and 10^4 s, so memory stays constant whatever the trace length. Both fidelities use it, so
their percentiles are read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LOW_S = 1e-3
HIGH_S = 1e4
BINS = 1400  # 7 decades: about 1.2% per bin
_EDGES = np.geomspace(LOW_S, HIGH_S, BINS + 1)
SLO_TTFT_TARGETS_S = (0.2, 0.5, 1.0, 2.0, 5.0)
NAMED_SLO_TTFT_S = 1.0  # the SLO the headline table names: TTFT <= 1 s


@dataclass
class Histogram:
    counts: np.ndarray = field(default_factory=lambda: np.zeros(BINS + 2))

    def add(self, values_s, weights=None) -> None:
        values = np.atleast_1d(np.asarray(values_s, dtype=np.float64))
        idx = np.searchsorted(_EDGES, values, side="right")  # 0: below LOW_S, BINS + 1: above HIGH_S
        self.counts += np.bincount(idx, weights=None if weights is None else np.atleast_1d(weights),
                                   minlength=BINS + 2)

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), read at the geometric middle of its bin."""
        if self.total <= 0:
            return float("nan")
        rank = q / 100.0 * self.total
        i = int(np.searchsorted(np.cumsum(self.counts), rank, side="left"))
        if i == 0:
            return LOW_S
        if i >= BINS + 1:
            return HIGH_S
        return float(np.sqrt(_EDGES[i - 1] * _EDGES[i]))

    def share_at_most(self, target_s: float) -> float:
        """Fraction of the recorded requests at or under target_s (to the bin)."""
        if self.total <= 0:
            return float("nan")
        i = int(np.searchsorted(_EDGES, target_s, side="right"))
        return float(self.counts[:i].sum() / self.total)


@dataclass
class Tally:
    """What one policy's run counts; every request ends in exactly one of served, rejected or queued."""

    arrived: float = 0.0
    served: float = 0.0
    rejected_429: float = 0.0
    rejected_503: float = 0.0
    gpu_s: float = 0.0
    cold_starts: float = 0.0
    ttft: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    cold_wait: Histogram = field(default_factory=Histogram)
    timeline_s: list[float] = field(default_factory=list)
    timeline_replicas: list[float] = field(default_factory=list)

    def summary(self, still_queued: float, node_pool: str) -> dict:
        answered = self.ttft.total
        refused = self.rejected_429 + self.rejected_503
        slo = {f"{t:g}": _attain(self.ttft, t, refused) for t in SLO_TTFT_TARGETS_S}
        return {
            "gpu_hours": self.gpu_s / 3600.0,
            "node_pool": node_pool,
            "requests": {"arrived": self.arrived, "served": self.served, "rejected_429": self.rejected_429,
                         "rejected_503": self.rejected_503, "still_queued": still_queued, "first_token": answered},
            "ttft_s": {"p50": self.ttft.percentile(50), "p99": self.ttft.percentile(99)},
            "e2e_s": {"p50": self.e2e.percentile(50), "p99": self.e2e.percentile(99)},
            "slo_attainment": slo,
            "named_slo": {"ttft_s": NAMED_SLO_TTFT_S, "attainment": slo[f"{NAMED_SLO_TTFT_S:g}"]},
            "cold_starts": self.cold_starts,
            "cold_start_wait_s": {"p50": self.cold_wait.percentile(50), "p99": self.cold_wait.percentile(99)},
            "replicas": {"time_s": self.timeline_s, "total": self.timeline_replicas},
        }


def _attain(hist: Histogram, target_s: float, refused: float) -> float:
    """Requests whose first token came within target_s, over all that got a first token or a refusal."""
    total = hist.total + refused
    return float(hist.share_at_most(target_s) * hist.total / total) if total > 0 else float("nan")
