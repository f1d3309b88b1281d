"""The pool benchmark's figures from two arm runs: one summary per arm (the JSON of bench-results/pool.json)
and the plot. `integrate` and `percentile` are pure, so the figures are checked without a run.

Replica-seconds integrate the arm's ready replicas (its Deployments' `status.readyReplicas`, sampled every
0.2 s; each sample holds until the next) over the replay: from the first request's scheduled send to the last
request's end (`replica_seconds`); also over the trace's own span, the same for both arms (to the last
request's send), and from the arm's first object applied to the last request's end (start-up included). Cold requests are counted two ways (docs/benchmarks.md, "Shared pool against dedicated
replicas"): from the gateway's counters, and from 0.2 s samples of the pool pods' model states.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2e.pool_bench.arms import ArmRun

TTFT_QUANTILES = (50, 90, 99)


def integrate(samples: Sequence[tuple[float, float]], start_s: float, end_s: float) -> float:
    """∫ value dt over [start_s, end_s] of the step function the samples make (value holds until the next);
    before the first sample, the value is the first sample's."""
    if not samples or end_s <= start_s:
        return 0.0
    total = 0.0
    points = [*samples, (math.inf, samples[-1][1])]
    total += samples[0][1] * max(0.0, min(samples[0][0], end_s) - start_s)
    for (t0, value), (t1, _) in itertools.pairwise(points):
        total += value * max(0.0, min(t1, end_s) - max(t0, start_s))
    return total


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linear between closest ranks (numpy's default); None when there are no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ttft(values: Sequence[float]) -> dict[str, Any]:
    return {"count": len(values), **{f"p{q}_s": _round(percentile(values, q)) for q in TTFT_QUANTILES},
            "max_s": _round(max(values, default=None))}


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def summarize(run: ArmRun) -> dict[str, Any]:
    ok = [r for r in run.results if r.ok]
    failures = [r for r in run.results if not r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    cold = [r.ttft_s for r, c in zip(run.results, run.cold_sampled, strict=True) if c and r.ok and r.ttft_s is not None]
    warm = [r.ttft_s for r, c in zip(run.results, run.cold_sampled, strict=True) if not c and r.ok and r.ttft_s is not None]
    tiers = {k.split("tier=")[1].rstrip("}"): v for k, v in run.gateway.items()
             if k.startswith("flotilla_gateway_residency_choices_total{tier=")}
    held = run.gateway.get("flotilla_gateway_hold_seconds_count", 0.0)
    loads = run.server.get("flotilla_model_load_seconds_count", 0.0)
    by_model: dict[str, int] = {}
    for r in run.results:
        by_model[r.model] = by_model.get(r.model, 0) + 1
    replay_s = run.end_s - run.start_s
    replica_s = integrate(run.replicas, run.start_s, run.end_s)
    span_s = max((r.at_s for r in run.results), default=0.0)
    return {
        "arm": run.name,
        "models": run.names,
        "requests": len(run.results),
        "requests_by_model": by_model,
        "completed": len(ok),
        "failures": len(failures),
        "failures_by_status": _count(str(r.status) for r in failures),
        "failure_examples": [f"{r.model} {r.status}: {r.error}" for r in failures[:3]],
        "ttft": ttft(ttfts),
        "ttft_cold_sampled": ttft(cold),
        "ttft_warm_sampled": ttft(warm),
        "replay_s": round(replay_s, 1),
        "start_up_s": round(run.ready_s - run.applied_s, 1),
        "replica_seconds": round(replica_s, 1),
        "mean_ready_replicas": round(replica_s / replay_s, 2) if replay_s > 0 else None,
        "replica_seconds_trace_span": round(integrate(run.replicas, run.start_s, run.start_s + span_s), 1),
        "replica_seconds_from_apply": round(integrate(run.replicas, run.applied_s, run.end_s), 1),
        "cold_requests_gateway": int(sum(v for t, v in tiers.items() if t != "loaded") + held),
        "cold_requests_sampled": sum(run.cold_sampled),
        "gateway_residency_tiers": {t: int(v) for t, v in tiers.items() if v},
        "gateway_held": int(held),
        "model_loads": int(loads),
        "mean_load_s": _round(run.server.get("flotilla_model_load_seconds_sum", 0.0) / loads if loads else None),
        "evictions": int(run.server.get("flotilla_model_evictions_total", 0.0)),
        "max_send_lag_s": _round(max((r.sent_s - run.start_s - r.at_s for r in run.results), default=0.0)),
        "loadavg": run.loadavg,
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def plot(runs: Sequence[ArmRun], summaries: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_r, ax_cdf) = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"pool": "tab:orange", "dedicated": "tab:blue"}
    for run, summary in zip(runs, summaries, strict=True):
        color = colors.get(run.name)
        label = f"{run.name} ({summary['replica_seconds']:.0f} replica-s)"
        ok = [(r, c) for r, c in zip(run.results, run.cold_sampled, strict=True) if r.ok and r.ttft_s is not None]
        for cold, marker, what in ((False, "o", ""), (True, "x", ", model loaded on no pod")):
            points = [r for r, c in ok if c == cold]
            if points:
                ax_t.scatter([r.sent_s - run.start_s for r in points], [r.ttft_s for r in points], s=8,
                             marker=marker, color=color, alpha=0.6, label=run.name + what)
        steps = [(t - run.start_s, n) for t, n in run.replicas if run.start_s - 5 <= t <= run.end_s]
        if steps:
            ax_r.step([t for t, _ in steps], [n for _, n in steps], where="post", color=color, label=label)
        values = sorted(r.ttft_s for r, _ in ok)
        if values:
            ax_cdf.plot(values, [(i + 1) / len(values) for i in range(len(values))], color=color,
                        label=f"{run.name}: p50 {summary['ttft']['p50_s']:.2f} s, p99 {summary['ttft']['p99_s']:.2f} s")
    ax_t.set_yscale("log")
    ax_t.set(xlabel="send time (s from the replay's start)", ylabel="TTFT (s, log)", title="TTFT of each request")
    ax_r.set(xlabel="time (s from the replay's start)", ylabel="ready replicas", title="replicas ready",
             ylim=(0, max([n for run in runs for _, n in run.replicas] + [1]) + 1))
    ax_cdf.set_xscale("log")
    ax_cdf.set(xlabel="TTFT (s, log)", ylabel="share of requests", title="TTFT CDF")
    for ax in (ax_t, ax_r, ax_cdf):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("4 tiny models: one pool of 2 replicas (budget for 2 models each) vs 4 dedicated replicas, "
                 "same Azure conv trace window")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
