"""PNG plot of a `flotilla-bench coldload` report: a cold request's TTFT from disk against parked (each round and
the median), and where each arm's median load went (start, read, build, warm-up).

Also a command, to redraw the plot of a report already written:
`python -m flotilla_server.bench.cold_loads_plot REPORT.json PLOT.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import redraw_main, save_figure

ARM_COLORS = {"disk": "tab:gray", "parked": "tab:blue"}
PHASES = (("start_s", "start (fork / wake)", "tab:purple"), ("read_s", "read", "tab:orange"),
          ("build_s", "build", "tab:green"), ("warmup_s", "warm-up", "tab:red"))


def plot_cold_loads(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(report["median"])
    fig, (ttft, split) = plt.subplots(1, 2, figsize=(11, 4))
    for x, arm in enumerate(arms):
        runs = [r["ttft_s"] * 1000 for r in report["rounds"] if r["arm"] == arm]
        median = report["median"][arm]["ttft_s"] * 1000
        ttft.bar(x, median, color=ARM_COLORS.get(arm, "tab:gray"), width=0.6)
        ttft.scatter([x] * len(runs), runs, color="black", s=12, zorder=3)
        ttft.annotate(f"{median:,.0f} ms", (x, median), ha="center", va="bottom", fontsize=9)
    ttft.set_xticks(range(len(arms)), arms)
    ttft.set_ylabel("TTFT of a request that finds the model unloaded (ms)")
    ttft.set_title(f"parked / disk = {report['ratio_ttft']:.2f}x (target <= {report['target_ratio']}x)")
    ttft.grid(axis="y", alpha=0.3)
    for x, arm in enumerate(arms):
        bottom = 0.0
        for key, label, color in PHASES:
            value = report["median"][arm][key] * 1000
            split.bar(x, value, bottom=bottom, color=color, width=0.6, label=label if x == 0 else None)
            bottom += value
    split.set_xticks(range(len(arms)), arms)
    split.set_ylabel("median load, by phase (ms)")
    split.set_title("the load's phases (server's load report)")
    split.legend(fontsize=8)
    split.grid(axis="y", alpha=0.3)
    cpu = report["cpu"]
    load = ", ".join(f"{x:.1f}" for x in report["load_average_before"])
    fig.suptitle(f"{report['model']} in a pool server, {report['isa']} ISA, {cpu.get('model_name')} (family "
                 f"{cpu.get('family')}, model {cpu.get('model')}, {cpu.get('cpus')} CPUs), load average {load}; "
                 f"median of {len(report['rounds']) // len(arms)} rounds", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], "flotilla_server.bench.cold_loads_plot", plot_cold_loads))
