"""PNG plot of a `flotilla-bench llamacpp` report: output tokens/s per server, client count and ISA run.

Also a command, to redraw the plot of a report already written:
`python -m flotilla_server.bench.llama_compare_plot REPORT.json PLOT.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import redraw_main, save_figure

SERVERS = (("flotilla", "Flotilla (gguf blocks)", "tab:blue"), ("flotilla-float32", "Flotilla (float32)", "tab:cyan"),
           ("llama-server", "llama-server", "tab:orange"))


def plot_llama(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    isas = list(report["medians"])
    clients = [str(c) for c in report["config"]["clients"]]
    fig, axes = plt.subplots(len(clients), len(isas), figsize=(max(8.0, 5.5 * len(isas)), 3.6 * len(clients) + 0.6), squeeze=False)
    for col, isa in enumerate(isas):
        medians = report["medians"][isa]
        for row, n in enumerate(clients):
            ax = axes[row][col]
            shown = [s for s in SERVERS if n in medians.get(s[0], {})]
            for x, (server, label, color) in enumerate(shown):
                median = medians[server][n]
                rounds = [r["tokens_per_s"] for r in report["runs"]
                          if r["isa"] == isa and r["server"] == server and str(r["clients"]) == n]
                ax.bar(x, median, color=color, width=0.6, label=label)
                ax.scatter([x] * len(rounds), rounds, color="black", s=10, zorder=3)
                ratio = report["ratios"][isa][n].get(f"{server}/llama-server")
                text = f"{median:,.0f}" + (f"\n{ratio:.2f}x" if ratio is not None else "")
                ax.annotate(text, (x, max([median, *rounds])), xytext=(0, 4), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8)
            ax.set_xticks(range(len(shown)), [s[1] for s in shown], fontsize=8)
            ax.set_ylim(0, max(medians[s[0]][n] for s in shown) * 1.3)
            ax.set_title(f"{isa}: {n} client{'s' if n != '1' else ''}", fontsize=10)
            ax.set_ylabel("output tokens/s")
            ax.grid(axis="y", alpha=0.3)
    cpu = report["cpu"]
    fig.suptitle(f"flotilla-bench llamacpp — {Path(report['config']['model']).name}, {report['config']['max_tokens']} "
                 f"streamed tokens a request\non {cpu.get('model_name')} ({cpu.get('cpus')} CPUs); "
                 f"bars: median of {report['config']['rounds']} interleaved rounds; dots: rounds; "
                 "ratios: over llama-server", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], __spec__.name, plot_llama))
