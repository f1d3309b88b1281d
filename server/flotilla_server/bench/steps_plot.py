"""PNG plot of a `flotilla-bench steps` report: each decode step's time split into its parts, per model and
batch size, as shares of the step (so batch 1 and batch 64 read on one axis) with the step's milliseconds
and tokens/s above each bar.

Also a command, to redraw the plot of a report already written:
`python -m flotilla_server.bench.steps_plot REPORT.json PLOT.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flotilla_server.bench.figures import redraw_main, save_figure

PARTS = (  # split-run key, legend label, colour
    ("forward_rest_s", "forward: matmuls, norms, activations", "tab:blue"),
    ("gather_s", "forward: KV gather", "tab:cyan"),
    ("attention_s", "forward: attention", "tab:green"),
    ("kv_write_s", "forward: KV write", "tab:olive"),
    ("logits_s", "forward: logits", "tab:purple"),
    ("schedule_s", "schedule", "tab:orange"),
    ("prepare_s", "prepare inputs", "tab:red"),
    ("sample_s", "sample", "tab:pink"),
    ("update_s", "update", "tab:brown"),
    ("detokenize_s", "detokenize", "tab:gray"),
    ("other_s", "other", "black"),
)


def plot_steps(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(model, batch, b) for model, m in report["models"].items() for batch, b in m["batches"].items()]
    fig, ax = plt.subplots(figsize=(max(8.5, 1.1 * len(bars) + 4), 4.6))
    for x, (_, _, b) in enumerate(bars):
        split = b["split"]
        total = sum(max(split[key], 0.0) for key, _, _ in PARTS)
        bottom = 0.0
        for key, label, color in PARTS:
            share = max(split[key], 0.0) / total if total else 0.0
            ax.bar(x, share, bottom=bottom, color=color, width=0.7, label=label if x == 0 else None)
            bottom += share
        ax.annotate(f"{b['plain']['step_s'] * 1e3:.1f} ms\n{b['decode_tokens_per_s']:.0f} tok/s", (x, 1.0),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(bars)), [f"{model}\nbatch {batch}" for model, batch, _ in bars], fontsize=8)
    ax.set_ylim(0, 1.18)
    ax.set_ylabel("share of the decode step")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_title(f"flotilla-bench steps — {report.get('dtype', 'float32')}, threads={report['threads']}, "
                 f"context {report['context']}, median of {report['steps']} steps", fontsize=10)
    save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], __spec__.name, plot_steps))
