"""Figures of an online benchmark run, from per-request records: pure, so they can be checked by hand.

Follows vLLM's benchmark_serving definitions: TTFT (send to first content), ITL (gaps between content
chunks), TPOT ((E2E − TTFT) ÷ (output tokens − 1)), E2E; goodput counts completed requests that meet
every SLO given.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 95, 99)


@dataclass
class RequestRecord:
    start_s: float  # relative to the run's start
    status: str  # "200", "429", ..., "cancelled", "connect_error", "stream_error"
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of each content chunk, run-relative
    retry_after: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "200"

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times_s, self.chunk_times_s[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def _dist(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    arr = np.asarray(values, dtype=float) * 1000.0
    return {"mean": float(arr.mean()), **{f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}}


def summarize(records: list[RequestRecord], duration_s: float, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict[str, Any]:
    """The run's figures; latencies in milliseconds, throughputs per second of wall time."""
    duration_s = max(duration_s, 1e-9)
    done = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in done)

    def meets_slo(r: RequestRecord) -> bool:
        if slo_ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1000 > slo_ttft_ms):
            return False
        tpot = r.tpot_s
        return not (slo_tpot_ms is not None and tpot is not None and tpot * 1000 > slo_tpot_ms)

    good = [r for r in done if meets_slo(r)]
    return {
        "duration_s": duration_s,
        "num_requests": len(records),
        "completed": len(done),
        "status_counts": dict(sorted(Counter(r.status for r in records).items())),
        "request_throughput_per_s": len(done) / duration_s,
        "output_token_throughput_per_s": out_tokens / duration_s,
        "total_token_throughput_per_s": (out_tokens + sum(r.prompt_tokens for r in done)) / duration_s,
        "goodput_requests_per_s": len(good) / duration_s,
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms, "met": len(good)},
        "ttft_ms": _dist([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_ms": _dist([t for r in done if (t := r.tpot_s) is not None]),
        "itl_ms": _dist([x for r in done for x in r.itls_s]),
        "e2e_ms": _dist([r.e2e_s for r in done if r.e2e_s is not None]),
    }


def records_as_dicts(records: list[RequestRecord]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(r).items() if k != "chunk_times_s"} for r in records]
