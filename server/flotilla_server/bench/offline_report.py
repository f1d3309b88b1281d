"""The offline benchmark's figures as a printed table and a PNG (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import save_figure

MODE_COLORS = {"continuous": "#2a7", "static": "#58c", "static_unpadded": "#9bd", "sequential": "#c85",
               "transformers": "#999"}
# what each mode means, printed under the table so that the two static figures are not confused
MODE_NOTES = (
    "static: rectangular batches (prompts left-padded to the batch's longest, outputs run to the longest), "
    "as transformers generate and the Orca paper's baseline",
    "static_unpadded: the same batches, each prompt prefilled at its own length (outputs still run to the longest)",
)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(report: dict[str, Any]) -> None:
    print(f"{'workload':12s} {'mode':15s} {'requests':>8s} {'out tokens':>10s} {'seconds':>8s} {'tokens/s':>9s} "
          f"{'tok/cpu-s':>9s}")
    for name, w in report["workloads"].items():
        for mode, m in w["modes"].items():
            print(f"{name:12s} {mode:15s} {m['requests']:8d} {m['output_tokens']:10d} {m['duration_s']:8.1f} "
                  f"{m['output_tokens_per_s']:9.1f} {m.get('output_tokens_per_cpu_s', 0):9.1f}")
        ratios = "  ".join(f"{k}={v:.2f}x" for k, v in w.get("ratios", {}).items())
        print(f"{name:12s} kv_utilization={_fmt(w.get('kv_utilization'), '.3f')} "
              f"({w.get('kv_utilization_steps', 0)} steps)  forward_fraction={_fmt(w.get('forward_fraction'), '.3f')} "
              f"({w.get('forward_fraction_steps', 0)} steps)  {ratios}")
    for note in MODE_NOTES:
        print(note)
    print(f"threads={report['threads']}  total {report.get('total_s', 0):.0f} s")


def plot_results(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = report["workloads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    for col, w in enumerate(workloads.values()):
        ax = axes[0][col]
        modes = list(w["modes"])
        values = [w["modes"][m]["output_tokens_per_s"] for m in modes]
        bars = ax.bar(modes, values, color=[MODE_COLORS.get(m, "#999") for m in modes])
        ax.bar_label(bars, fmt="%.0f")
        ax.tick_params(axis="x", labelsize=8)
        ax.set_title(f"{w['description']}", fontsize=9)
        ax.set_ylabel("output tokens/s")
        ratios = ", ".join(f"{k.removeprefix('continuous_over_')} {v:.1f}x" for k, v in w.get("ratios", {}).items())
        ax.set_xlabel(f"continuous vs: {ratios}", fontsize=8)
        ax2 = axes[1][col]
        batch = w.get("continuous_batch_by_step", [])
        ax2.plot(range(len(batch)), batch, lw=0.8)
        ax2.set_xlabel("continuous step")
        ax2.set_ylabel("sequences in the step")
        ax2.set_title(f"kv_utilization {_fmt(w.get('kv_utilization'), '.3f')}, "
                      f"forward_fraction {_fmt(w.get('forward_fraction'), '.3f')}", fontsize=9)
    save_figure(fig, path)
