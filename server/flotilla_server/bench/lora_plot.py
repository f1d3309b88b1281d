"""PNG plot of a `flotilla-bench lora` report: output tokens/s of the base and the 8-adapter workloads (bars:
medians; dots: rounds), and the memory of 8 adapters against 8 copies of the model.

Also a command, to redraw the plot of a report already written:
`python -m flotilla_server.bench.lora_plot REPORT.json PLOT.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import redraw_main, save_figure

LABELS = {"base": "base model", "adapters": "8 adapters,\nround-robin"}


def plot_lora(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, m = report["config"], report["memory"]
    fig, (speed, mem) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1.2, 1]})
    for x, (workload, color) in enumerate((("base", "tab:gray"), ("adapters", "tab:green"))):
        median = report["median_tokens_per_s"][workload]
        rounds = [r["tokens_per_s"] for r in report["runs"] if r["workload"] == workload]
        speed.bar(x, median, color=color, width=0.6)
        speed.scatter([x] * len(rounds), rounds, color="black", s=10, zorder=3)
        speed.annotate(f"{median:,.1f}", (x, max([median, *rounds])), xytext=(0, 4), textcoords="offset points",
                       ha="center", va="bottom", fontsize=9)
    speed.set_xticks([0, 1], [LABELS["base"], LABELS["adapters"]])
    speed.set_ylabel("output tokens/s")
    speed.set_ylim(0, max(r["tokens_per_s"] for r in report["runs"]) * 1.25)
    t = report["target"]
    speed.set_title(f"adapters / base: {report['ratio']:.2f}x (target {t['ratio']}x, goal {t['goal']}x)", fontsize=10)
    speed.grid(axis="y", alpha=0.3)
    parts = [("adapter slots", m["adapter_slot_bytes"], "tab:green"), ("adapter host copies", m["adapter_host_bytes"],
             "tab:olive")]
    bottom = 0.0
    for label, value, color in parts:
        mem.bar(0, value / 2**20, bottom=bottom, color=color, width=0.6, label=label)
        bottom += value / 2**20
    mem.bar(1, m["model_copies_bytes"] / 2**20, color="tab:gray", width=0.6, label="model weights")
    for x, value in ((0, m["adapters_bytes"]), (1, m["model_copies_bytes"])):
        mem.annotate(f"{value / 2**20:,.0f} MiB", (x, value / 2**20), xytext=(0, 4), textcoords="offset points",
                     ha="center", va="bottom", fontsize=9)
    n = m["adapters"]
    mem.set_xticks([0, 1], [f"{n} adapters", f"{n} model copies"])
    mem.set_ylabel("MiB")
    mem.set_ylim(0, m["model_copies_bytes"] / 2**20 * 1.2)
    mem.set_title(f"memory: {m['adapters_over_copies']:.3f}x", fontsize=10)
    mem.legend(fontsize=8, loc="upper left")
    mem.grid(axis="y", alpha=0.3)
    cpu = report["cpu"]
    fig.suptitle(f"flotilla-bench lora: {c['model']}, {n} adapters of rank {c['rank']}, {c['clients']} clients, "
                 f"{c['requests']} requests x {c['output_len']} tokens, {c['dtype']}\non {cpu.get('model_name')} "
                 f"({cpu.get('cpus')} CPUs); bars: median of {c['rounds']} interleaved rounds; dots: rounds",
                 fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], __spec__.name, plot_lora))
