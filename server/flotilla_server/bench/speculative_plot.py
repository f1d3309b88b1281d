"""PNG plot of a `flotilla-bench speculative` report: tokens/s with and without speculation, per task and ISA.

Also a command, to redraw the plot of a report already written:
`python -m flotilla_server.bench.speculative_plot REPORT.json PLOT.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import redraw_main, save_figure

TASKS = (("edit", "edit: copy a 494-token passage"), ("free", "free writing (chat)"))


def plot_speculative(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    isas = list(report["summary"])
    fig, axes = plt.subplots(1, len(TASKS), figsize=(10, 3.8))
    for ax, (task, title) in zip(axes, TASKS, strict=True):
        for i, isa in enumerate(isas):
            s = report["summary"][isa]
            runs = report["results"][isa]["runs"]
            for j, (arm, color) in enumerate((("off", "tab:gray"), ("ngram", "tab:blue"))):
                x = i * 3 + j
                median = s["median_tokens_per_s"][task][arm]
                ax.bar(x, median, color=color, width=0.8, label=("speculation " + arm) if i == 0 else None)
                dots = [r["tokens_per_s"] for r in runs if r["task"] == task and r["arm"] == arm]
                ax.scatter([x] * len(dots), dots, color="black", s=10, zorder=3)
                ax.annotate(f"{median:.0f}", (x, median), ha="center", va="bottom", fontsize=8)
        ax.set_xticks([i * 3 + 0.5 for i in range(len(isas))],
                      [f"{isa}\nngram / off: {report['summary'][isa]['ratio'][task]:.2f}x" for isa in isas])
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("output tokens/s (1 client)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    c = report["config"]
    fig.suptitle(f"flotilla-bench speculative — {Path(c['model']).name}, --speculative ngram (k = {c['k'] or 'default'}) "
                 f"against none\nbars: median of {c['rounds']} interleaved rounds; dots: rounds", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], __spec__.name, plot_speculative))
