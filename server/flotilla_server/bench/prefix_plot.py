"""PNG plot of a `flotilla-bench prefix` report: caching off against on, each figure's runs and median.

Also a command, to redraw the plot of a report already written:
`python -m flotilla_server.bench.prefix_plot REPORT.json PLOT.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import redraw_main, save_figure

FIGURES = (  # report key, axis label, scale to display units
    ("prefill_tokens", "prefill tokens computed", 1.0),
    ("ttft_p50_s", "TTFT p50 (ms)", 1000.0),
    ("output_tokens_per_s", "output tokens/s", 1.0),
)


def plot_prefix(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIGURES), figsize=(12, 3.8))
    for ax, (key, label, scale) in zip(axes, FIGURES, strict=True):
        for x, (caching, name, color) in enumerate(((False, "off", "tab:gray"), (True, "on", "tab:blue"))):
            runs = [r[key] * scale for r in report["runs"] if r["caching"] is caching]
            median = report["median_on" if caching else "median_off"][key] * scale
            ax.bar(x, median, color=color, width=0.6, label=f"caching {name}")
            ax.scatter([x] * len(runs), runs, color="black", s=12, zorder=3)
            ax.annotate(f"{median:,.0f}", (x, median), ha="center", va="bottom", fontsize=9)
        ax.set_xticks([0, 1], ["caching off", "caching on"])
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    w = report["workload"]
    fig.suptitle(
        f"flotilla-bench prefix — {w['model']}: {w['num_requests']} requests, {w['num_prefixes']} system prompts of "
        f"{w['prefix_len']} tokens + {w['question_len']}-token questions\nprefill {report['prefill_tokens_ratio']:.2f}x "
        f"fewer (ceiling {report['ceiling_prefill_ratio']:.2f}x), TTFT p50 {report['ttft_p50_ratio']:.2f}x lower "
        f"(bars: median of {w['runs']}; dots: runs)", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], __spec__.name, plot_prefix))
