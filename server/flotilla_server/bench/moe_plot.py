"""PNG plot of a `flotilla-bench moe` report: MoE and dense tokens/s at 1 and 16 clients, per ISA, with the bars.

Also a command, to redraw the plot of a report already written:
`python -m flotilla_server.bench.moe_plot REPORT.json PLOT.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import redraw_main, save_figure


def plot_moe(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = list(report["bars"])
    fig, axes = plt.subplots(1, len(clients), figsize=(10, 3.8))
    for ax, c in zip(axes, clients, strict=True):
        isas = list(report["summary"])
        for i, isa in enumerate(isas):
            s = report["summary"][isa]
            for j, (model, color) in enumerate((("moe", "tab:blue"), ("dense", "tab:gray"))):
                x = i * 3 + j
                median = s["median_tokens_per_s"][model][c]
                ax.bar(x, median, color=color, width=0.8, label=model if i == 0 else None)
                dots = [r["tokens_per_s"] for r in report["results"][isa]["runs"]
                        if r["model"] == model and str(r["clients"]) == c]
                ax.scatter([x] * len(dots), dots, color="black", s=10, zorder=3)
                ax.annotate(f"{median:.0f}", (x, median), ha="center", va="bottom", fontsize=8)
        ax.set_xticks([i * 3 + 0.5 for i in range(len(isas))],
                      [f"{isa}\nMoE / dense: {report['summary'][isa]['ratio'][c]:.2f}x (bar {report['bars'][c]}x)"
                       for isa in isas])
        ax.set_title(f"{c} client{'s' if c != '1' else ''}", fontsize=9)
        ax.set_ylabel("output tokens/s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    cfg = report["config"]
    models = next(iter(report["results"].values()))["models"]
    fig.suptitle(f"flotilla-bench moe — {cfg['experts']} experts top-{cfg['top_k']} (width {cfg['expert_width']}) "
                 f"against a dense Llama of width {models['dense']['intermediate_size']}, "
                 f"{models['moe']['parameters'] / 1e6:.1f} / {models['dense']['parameters'] / 1e6:.1f} M parameters, "
                 f"{cfg.get('dtype', 'float32')}, {cfg['threads']} thread(s)\nbars: median of {cfg['rounds']} interleaved rounds; dots: rounds; "
                 f"{report['cpu'].get('model_name')}", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], __spec__.name, plot_moe))
