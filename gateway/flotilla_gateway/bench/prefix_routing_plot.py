"""The prefix-routing bench's plot: TTFT CDFs, hit rate and in-flight balance per run (bench/prefix_routing.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, w = list(summary["medians"]), summary["workload"]
    fig, (cdf, hit, balance) = plt.subplots(1, 3, figsize=(14, 4))
    for arm in arms:
        ttfts = sorted(t for r in summary["runs"] if r["arm"] == arm for t in r["ttfts_ms"])
        cdf.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], label=arm)
        mine = [r for r in summary["runs"] if r["arm"] == arm]
        hit.scatter([r["run"] for r in mine], [r["prefix_hit_rate"] for r in mine], label=arm)
        balance.scatter([r["run"] for r in mine], [r["in_flight_max_over_mean"] for r in mine], label=arm)
    cdf.set(xlabel="TTFT (ms), all runs", ylabel="share of requests", title="TTFT", xscale="log")
    hit.axhline(0.8, color="grey", linestyle="--")
    hit.set(xlabel="run", ylabel="hit ÷ queried prompt tokens", title="server-side prefix hit rate", ylim=(0, 1))
    balance.axhline(1.5, color="grey", linestyle="--")
    balance.set(xlabel="run", ylabel="max ÷ mean", title="in-flight per replica (time averages)")
    for ax in (hit, balance):
        ax.set_xticks(range(w["runs"]))
    for ax in (cdf, hit, balance):
        ax.legend()
    fig.suptitle(f"{w['replicas']} × tiny, {w['tenants']} tenants × {w['system_tokens']}-token system prompts, "
                 f"{w['requests']} requests at concurrency {w['concurrency']}, {w['num_kv_blocks']} KV blocks each")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


