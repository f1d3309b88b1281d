"""Outputs of a run: JSON (everything), PNG (replicas over time; cost against SLO, at each TTFT target and
per policy at the named one), a Markdown table.

Every output names its server profile's `source`, so a roofline figure is always labelled a model.
The verdict (which policy wins at which SLO, by how much in GPU-hours) is computed here from the
results, never typed in: at each TTFT target, the cheapest policy whose attainment reaches
WIN_ATTAINMENT wins, and its margin is counted against the next cheapest that also reaches it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from flotilla_sim.stats import NAMED_SLO_TTFT_S, SLO_TTFT_TARGETS_S

WIN_ATTAINMENT = 0.99  # a policy "meets" a TTFT target when 99% of requests get their first token within it


def verdicts(results: dict) -> list[dict]:
    rows = []
    for target in SLO_TTFT_TARGETS_S:
        key = f"{target:g}"
        meeting = sorted((r["gpu_hours"], name) for name, r in results.items()
                         if r["slo_attainment"][key] >= WIN_ATTAINMENT)
        row = {"ttft_target_s": target, "meeting": [n for _, n in meeting]}
        if meeting:
            row["winner"], row["gpu_hours"] = meeting[0][1], meeting[0][0]
            if len(meeting) > 1:
                row["runner_up"] = meeting[1][1]
                row["saving_gpu_hours"] = meeting[1][0] - meeting[0][0]
                row["saving_share"] = (meeting[1][0] - meeting[0][0]) / meeting[1][0] if meeting[1][0] else 0.0
        rows.append(row)
    return rows


def _hours(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _ms(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value * 1e3:,.0f}"


def markdown(results: dict, notes: dict, source: str) -> str:
    named = f"{NAMED_SLO_TTFT_S:g}"
    lines = [
        f"Server profile: {source}.",
        "",
        f"| policy | GPU-hours | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | E2E p99 ms | TTFT <= {named} s | "
        "cold starts | cold wait p99 s | 429 | 503 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        q = r["requests"]
        cold_p99 = r["cold_start_wait_s"]["p99"]
        lines.append(
            f"| {name} | {_hours(r['gpu_hours'])} | {_ms(r['ttft_s']['p50'])} | {_ms(r['ttft_s']['p99'])} | "
            f"{_ms(r['e2e_s']['p50'])} | {_ms(r['e2e_s']['p99'])} | {r['slo_attainment'][named]:.2%} | "
            f"{r['cold_starts']:,.0f} | {'-' if math.isnan(cold_p99) else f'{cold_p99:.1f}'} | "
            f"{q['rejected_429']:,.0f} | {q['rejected_503']:,.0f} |")
    lines.append("")
    for name, r in results.items():
        if "tiering" in r:
            t = r["tiering"]
            reasons = ", ".join(f"{k} {v}" for k, v in t["move_reasons"].items()) or "none"
            lines.append(f"- {name}: {t['promotions']} promotions, {t['demotions']} demotions "
                         f"({t['moves_per_hour']:.1f} moves an hour; {reasons}); {t['dedicated_at_end']} dedicated "
                         "at the end.")
    for v in verdicts(results):
        target = f"TTFT <= {v['ttft_target_s']:g} s for {WIN_ATTAINMENT:.0%} of requests"
        if "winner" not in v:
            lines.append(f"- {target}: no policy meets it.")
        elif "runner_up" not in v:
            lines.append(f"- {target}: only {v['winner']} meets it ({_hours(v['gpu_hours'])} GPU-hours).")
        else:
            lines.append(f"- {target}: {v['winner']} wins with {_hours(v['gpu_hours'])} GPU-hours, "
                         f"{_hours(v['saving_gpu_hours'])} ({v['saving_share']:.0%}) fewer than {v['runner_up']}.")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path, title: str, source: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right, named) = plt.subplots(1, 3, figsize=(19, 5.5))
    key = f"{NAMED_SLO_TTFT_S:g}"
    for name, r in results.items():
        hours = [t / 3600 for t in r["replicas"]["time_s"]]
        line, = left.plot(hours, r["replicas"]["total"], label=name, linewidth=1)
        targets = list(SLO_TTFT_TARGETS_S)
        right.plot([r["slo_attainment"][f"{t:g}"] for t in targets], [r["gpu_hours"]] * len(targets),
                   marker="o", label=name)
        for t in targets:
            right.annotate(f"{t:g}s", (r["slo_attainment"][f"{t:g}"], r["gpu_hours"]), fontsize=7,
                           textcoords="offset points", xytext=(2, 4))
        # one point per policy: its cost against the share of requests that missed the named SLO
        missed = max(1.0 - r["slo_attainment"][key], 1e-5)
        named.scatter([missed], [r["gpu_hours"]], color=line.get_color(), s=40)
        named.annotate(name, (missed, r["gpu_hours"]), fontsize=8, textcoords="offset points", xytext=(4, 3))
    left.set(xlabel="hour", ylabel="replicas (GPUs), log scale", title="replicas over time", yscale="log")
    right.set(xlabel="share of requests with TTFT within the target (labelled)", ylabel="GPU-hours, log scale",
              title="cost against SLO", yscale="log")
    right.axvline(0.99, color="grey", linestyle=":", linewidth=1)
    named.set(xlabel=f"share of requests missing TTFT <= {key} s (log; left is better)", xscale="log",
              ylabel="GPU-hours, log scale (lower is better)", yscale="log",
              title=f"GPU-hours against SLO attainment (TTFT <= {key} s)")
    named.axvline(1 - WIN_ATTAINMENT, color="grey", linestyle=":", linewidth=1)
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle(f"{title}\n{source}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict, notes: dict, source: str, out_dir: Path, name: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{name}.json", "png": out_dir / f"{name}.png", "md": out_dir / f"{name}.md"}
    document = {"scenario": notes, "server_profile": source, "policies": results, "verdicts": verdicts(results)}
    paths["json"].write_text(json.dumps(document, indent=1, default=float) + "\n")
    paths["md"].write_text(markdown(results, notes, source))
    plot(results, paths["png"], name, source)
    return paths
