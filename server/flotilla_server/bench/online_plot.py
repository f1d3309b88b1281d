"""PNG plots of an online benchmark run: latency distributions and output tokens per second over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import save_figure
from flotilla_server.bench.online_stats import RequestRecord


def plot_run(records: list[RequestRecord], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    done = [r for r in records if r.ok]
    fig, (ax_cdf, ax_tp) = plt.subplots(1, 2, figsize=(11, 4))
    series = {
        "TTFT": [r.ttft_s * 1000 for r in done if r.ttft_s is not None],
        "ITL": [x * 1000 for r in done for x in r.itls_s],
        "TPOT": [t * 1000 for r in done if (t := r.tpot_s) is not None],
        "E2E": [r.e2e_s * 1000 for r in done if r.e2e_s is not None],
    }
    for label, values in series.items():
        if values:
            v = np.sort(np.asarray(values))
            ax_cdf.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("latency (ms, log)")
    ax_cdf.set_ylabel("share of samples")
    ax_cdf.set_title("latency CDFs")
    ax_cdf.legend()
    ax_cdf.grid(alpha=0.3)
    times = [t for r in done for t in r.chunk_times_s]
    if times:
        bins = np.arange(0, max(times) + 1.0, 1.0)
        ax_tp.hist(times, bins=bins, color="tab:blue")
    ax_tp.set_xlabel("time since start (s)")
    ax_tp.set_ylabel("SSE chunks per second (one per engine event ≈ tokens/s)")
    cfg = summary.get("config", {})
    ax_tp.set_title(f"concurrency {cfg.get('concurrency')}: {summary['output_token_throughput_per_s']:.0f} tok/s")
    ax_tp.grid(alpha=0.3)
    fig.suptitle(f"flotilla-bench online — {cfg.get('model', '')}, {summary['completed']} requests")
    save_figure(fig, path)
