"""Figures, targets, tables and plot of `flotilla-bench priorities` (docs/benchmarks.md, "Priorities and tenants").

Pure apart from the plot: one arm's requests → a flat summary (`summarise`), runs → medians (`medians`),
medians → each case's rows with their targets (`case_rows`). Also a command, to redraw the plot of a
report already written: `python -m flotilla_server.bench.priorities_report REPORT.json PLOT.png`.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flotilla_contract.classes import BATCH, DEFAULT_CLASS_WEIGHTS, INTERACTIVE, TENANT_LIMIT

from flotilla_server.bench.figures import redraw_main, save_figure

CASES: dict[str, tuple[str, tuple[str, ...]]] = {  # name: (title, arms)
    "flood": ("batch flood + light interactive chat", ("idle", "fifo", "classes")),
    "throughput": ("batch throughput under light interactive load", ("batch_alone", "light", "classes")),
    "share": ("weighted share under constant interactive load", ("share_8_1", "share_3_1")),
    "tenants": ("tenant A floods, tenant B sends light load", ("tenant_flood", "tenant_cap")),
}
SHARE_WEIGHTS = {"share_8_1": dict(DEFAULT_CLASS_WEIGHTS), "share_3_1": {INTERACTIVE: 3.0, BATCH: 1.0}}
TTFT_RATIO_MAX, THROUGHPUT_RATIO_MIN, TENANT_RATIO_MAX = 1.5, 0.8, 1.2


@dataclass
class Rec:
    """One request as the client saw it; times in seconds since the arm's start."""

    load: str  # interactive, batch, A, B
    sent_s: float
    status: int = 0  # 0: no status line (connection failed, or cut at the arm's end)
    code: str = ""  # the error code of a refusal or of an error chunk
    retry_after: bool = False
    first_token_s: float | None = None
    tokens: int = 0
    window_tokens: int = 0  # tokens that arrived inside the measurement window

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); NaN when there are no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarise(recs: list[Rec], window: tuple[float, float]) -> dict[str, Any]:
    """Flat figures per load (`interactive.ttft_p95_ms`, `batch.tokens_per_s`, `batch.token_share`, ...)."""
    w0, w1 = window
    out: dict[str, Any] = {}
    loads = sorted({r.load for r in recs})
    all_tokens = sum(r.window_tokens for r in recs)
    all_admitted = sum(1 for r in recs if r.first_token_s is not None and w0 <= r.first_token_s < w1)
    for load in loads:
        mine = [r for r in recs if r.load == load]
        refused = [r for r in mine if r.status not in (0, 200)]
        ttfts = sorted(t * 1000 for r in mine if (t := r.ttft_s) is not None)
        tokens = sum(r.window_tokens for r in mine)
        admitted = sum(1 for r in mine if r.first_token_s is not None and w0 <= r.first_token_s < w1)
        codes: dict[str, int] = {}
        for r in refused:
            codes[r.code or str(r.status)] = codes.get(r.code or str(r.status), 0) + 1
        out |= {
            f"{load}.requests": len(mine), f"{load}.refused": len(refused),
            f"{load}.429": sum(r.status == 429 for r in refused),
            f"{load}.429_no_retry_after": sum(r.status == 429 and not r.retry_after for r in refused),
            f"{load}.{TENANT_LIMIT}": sum(r.code == TENANT_LIMIT for r in refused),
            f"{load}.stream_errors": sum(r.status == 200 and bool(r.code) for r in mine),
            f"{load}.ttft_samples": len(ttfts), f"{load}.ttft_p50_ms": pct(ttfts, 0.50),
            f"{load}.ttft_p95_ms": pct(ttfts, 0.95), f"{load}.ttft_p99_ms": pct(ttfts, 0.99),
            f"{load}.tokens_per_s": tokens / (w1 - w0), f"{load}.admitted": admitted,
            f"{load}.token_share": tokens / all_tokens if all_tokens else math.nan,
            f"{load}.admission_share": admitted / all_admitted if all_admitted else math.nan,
            f"{load}.codes": codes, f"{load}.ttft_ms": ttfts,
        }
    return out


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each numeric figure over the runs that have it (NaNs left out)."""
    keys = sorted({k for r in runs for k, v in r.items() if isinstance(v, int | float)})
    out = {}
    for k in keys:
        values = [r[k] for r in runs if isinstance(r.get(k), int | float) and not math.isnan(r[k])]
        out[k] = statistics.median(values) if values else math.nan
    return out


def paired_ratios(runs: dict[str, list[dict[str, Any]]], top: str, bottom: str, key: str) -> list[float]:
    """`top`'s figure over `bottom`'s, run by run. The arms of one run are measured back to back, minutes
    apart at most, while this host's speed drifts by up to a third between runs (docs/benchmarks.md,
    "Priorities and tenants"): a ratio within each run cancels most of that drift, a ratio of medians
    taken over different runs does not."""
    out = []
    for a, b in zip(runs.get(top, []), runs.get(bottom, []), strict=False):
        ratio = _ratio(a.get(key), b.get(key))
        if not math.isnan(ratio):
            out.append(ratio)
    return out


def weighted_share(weights: dict[str, float]) -> float:
    return weights[BATCH] / (weights[BATCH] + weights[INTERACTIVE])


def brief(s: dict[str, Any]) -> str:
    """One line of an arm's run, per load."""
    loads = sorted({k.split(".")[0] for k in s if "." in k})
    cores = ", ".join(f"{k.removeprefix('cores_')} {v:.2f}" for k, v in s.items() if k.startswith("cores_") and v)
    return "; ".join(f"{x}: TTFT p95 {s[f'{x}.ttft_p95_ms']:.0f} ms ({s[f'{x}.ttft_samples']}), "
                     f"{s[f'{x}.tokens_per_s']:.0f} tok/s, {s[f'{x}.refused']} refused {s[f'{x}.codes'] or ''}"
                     for x in loads) + (f"; cores: {cores}" if cores else "")


def _row(label: str, value: Any, target: str = "", met: bool | None = None) -> dict[str, Any]:
    return {"label": label, "value": value, "target": target, "met": met}


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b and not math.isnan(a) and not math.isnan(b) else math.nan


def case_rows(case: str, med: dict[str, dict[str, float]], runs: dict[str, list[dict[str, Any]]],
              samples: int) -> list[dict[str, Any]]:
    """The case's figures and targets; `met` is None where an arm it needs did not run."""
    def m(arm: str, key: str) -> float:
        return med.get(arm, {}).get(key, math.nan)

    def total(arm: str, key: str) -> float:
        return sum(r.get(key, 0) for r in runs[arm]) if runs.get(arm) else math.nan

    def codes(arm: str, load: str) -> str:
        out: dict[str, int] = {}
        for r in runs.get(arm, []):
            for code, n in (r.get(f"{load}.codes") or {}).items():
                out[code] = out.get(code, 0) + n
        return ", ".join(f"{c} {n}" for c, n in sorted(out.items())) or ("none" if runs.get(arm) else "-")

    def check(value: float, ok: bool) -> bool | None:
        return None if math.isnan(value) else ok

    rows: list[dict[str, Any]] = []
    if case == "flood":
        for arm in CASES[case][1]:
            p = [m(arm, f"interactive.ttft_p{q}_ms") for q in (50, 95, 99)]
            rows.append(_row(f"{arm}: interactive TTFT p50 / p95 / p99 (ms)", p))
        n = m("classes", "interactive.ttft_samples")
        rows.append(_row("classes: interactive TTFT samples per run", n, f">= {samples}", check(n, n >= samples)))
        r = _ratio(m("classes", "interactive.ttft_p95_ms"), m("idle", "interactive.ttft_p95_ms"))
        rows.append(_row("classes p95 / idle p95", r, f"<= {TTFT_RATIO_MAX}", check(r, r <= TTFT_RATIO_MAX)))
        r = _ratio(m("fifo", "interactive.ttft_p95_ms"), m("idle", "interactive.ttft_p95_ms"))
        rows.append(_row("fifo p95 / idle p95 (the flood saturates)", r, f"> {TTFT_RATIO_MAX}",
                         check(r, r > TTFT_RATIO_MAX)))
        t = total("classes", "interactive.refused")
        rows.append(_row("classes: interactive refused (all runs)", t, "0", check(t, t == 0)))
        rows.append(_row("fifo: interactive refused (all runs)", total("fifo", "interactive.refused")))
        rows.append(_row("batch 429s per run, fifo / classes", [m("fifo", "batch.429"), m("classes", "batch.429")]))
        rows.append(_row("classes: batch refusals by code (all runs)", codes("classes", "batch")))
    elif case == "throughput":
        alone = m("batch_alone", "batch.tokens_per_s")
        rows.append(_row("batch output tokens/s, alone / beside the light chat / beside the flood's chat",
                         [alone, m("light", "batch.tokens_per_s"), m("classes", "batch.tokens_per_s")]))
        def paired(arm: str) -> tuple[float, dict[str, Any]]:
            """The median of `arm`'s pairs with batch_alone, and the row listing each pair."""
            pairs = paired_ratios(runs, arm, "batch_alone", "batch.tokens_per_s")
            return (statistics.median(pairs) if pairs else math.nan,
                    _row(f"{arm} / alone, each run's pair; ratio of the medians",
                         [*pairs, _ratio(m(arm, "batch.tokens_per_s"), alone)]))

        r, each = paired("light")
        rows += [_row("light / alone, median of each run's pair", r, f">= {THROUGHPUT_RATIO_MIN}",
                      check(r, r >= THROUGHPUT_RATIO_MIN)), each]
        r, each = paired("classes")
        rows += [_row("for reference: classes (the flood's chat) / alone, median of each run's pair", r), each]
        rows.append(_row("for reference: fifo (unmarked, no reserve) batch tokens/s", m("fifo", "batch.tokens_per_s")))
    elif case == "share":
        for arm, weights in SHARE_WEIGHTS.items():
            ws = weighted_share(weights)
            label = f"{arm} ({weights[INTERACTIVE]:g}:{weights[BATCH]:g})"
            share = m(arm, "batch.token_share")
            # whole admissions: at least the weighted share less one admission (the stride bound, fair_admission.py)
            admitted = m(arm, "batch.admitted") + m(arm, "interactive.admitted")
            floor = ws - 1 / admitted if admitted > 0 else ws
            rows.append(_row(f"{label}: batch share of output tokens", share, f">= {ws:.3f} - 1 admission",
                             check(share, share >= floor)))
            rows.append(_row(f"{label}: batch share of admissions", m(arm, "batch.admission_share"), f"~ {ws:.3f}"))
            rows.append(_row(f"{label}: tokens/s interactive / batch",
                             [m(arm, "interactive.tokens_per_s"), m(arm, "batch.tokens_per_s")]))
    elif case == "tenants":
        n = m("tenant_flood", f"A.{TENANT_LIMIT}")
        rows.append(_row(f"tenant_flood: A's 429 {TENANT_LIMIT} per run", n, "> 0", check(n, n > 0)))
        t = total("tenant_flood", "A.429_no_retry_after")
        rows.append(_row("tenant_flood: A's 429s without Retry-After (all runs)", t, "0", check(t, t == 0)))
        t = total("tenant_cap", "A.refused")
        rows.append(_row("tenant_cap: A refused (all runs)", t, "0", check(t, t == 0)))
        flood, cap = m("tenant_flood", "B.ttft_p95_ms"), m("tenant_cap", "B.ttft_p95_ms")
        rows.append(_row("B's TTFT p95 (ms), A floods / A at its cap", [flood, cap]))
        r = _ratio(flood, cap)
        rows.append(_row("B p95 ratio, flood / cap", r, f"<= {TENANT_RATIO_MAX}", check(r, r <= TENANT_RATIO_MAX)))
        t = total("tenant_flood", "B.refused") + total("tenant_cap", "B.refused")
        rows.append(_row("B refused (all runs, both arms)", t, "0", check(t, t == 0)))
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return " / ".join(_fmt(x) for x in v)
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def format_case(case: str, rows: list[dict[str, Any]], missing: list[str]) -> str:
    lines = [f"== {case}: {CASES[case][0]}" + (f"  (not run: {', '.join(missing)})" if missing else "")]
    width = max(len(r["label"]) for r in rows) if rows else 0
    for r in rows:
        met = {True: "met", False: "NOT MET", None: "-" if r["target"] else ""}[r["met"]]
        lines.append(f"  {r['label']:<{width}}  {_fmt(r['value']):>22}  {r['target']:>9}  {met}")
    return "\n".join(lines)


def clean(obj: Any) -> Any:
    """NaN → None, so that the JSON is JSON."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean(v) for v in obj]
    return obj


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs, med = report["runs"], report["medians"]
    fig, ((ax_cdf, ax_tp), (ax_share, ax_ten)) = plt.subplots(2, 2, figsize=(12, 8))

    def val(arm: str, key: str) -> float:
        v = (med.get(arm) or {}).get(key)
        return math.nan if v is None else v

    for arm, color in (("idle", "tab:gray"), ("fifo", "tab:red"), ("classes", "tab:blue")):
        ttfts = np.sort([t for r in runs.get(arm, []) for t in r.get("interactive.ttft_ms", [])])
        sent = sum(r.get("interactive.requests") or 0 for r in runs.get(arm, [])) or len(ttfts)
        if len(ttfts):  # over every request sent: a refused one never arrives, the curve stays below 1
            ax_cdf.plot(ttfts, np.arange(1, len(ttfts) + 1) / sent, color=color,
                        label=f"{arm} ({sent - len(ttfts)} of {sent} refused)" if sent > len(ttfts) else arm)
    ax_cdf.set_xscale("log")
    ax_cdf.set(xlabel="interactive TTFT (ms, log)", ylabel="share of requests sent", title="flood: interactive TTFT CDF")
    ax_cdf.grid(alpha=0.3)
    if ax_cdf.lines:
        ax_cdf.legend()

    def bars(ax: Any, labels: list[str], values: list[float], title: str, ylabel: str, colors: Any = "tab:blue") -> None:
        shown = [0.0 if math.isnan(v) else v for v in values]
        ax.bar(range(len(labels)), shown, color=colors, width=0.6)
        for x, v in enumerate(values):
            ax.annotate("not run" if math.isnan(v) else _fmt(v), (x, shown[x]), ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set(title=title, ylabel=ylabel)
        ax.grid(axis="y", alpha=0.3)

    bars(ax_tp, ["batch alone", "beside light chat\n(light)", "beside flood's chat\n(classes)"],
         [val(arm, "batch.tokens_per_s") for arm in ("batch_alone", "light", "classes")],
         f"throughput: batch output tokens/s (target ≥ {THROUGHPUT_RATIO_MIN:g}×)", "tokens/s")
    labels, values = [], []
    for arm, weights in SHARE_WEIGHTS.items():
        labels += [f"{arm}\nweighted", f"{arm}\nmeasured"]
        values += [weighted_share(weights), val(arm, "batch.token_share")]
    bars(ax_share, labels, values, "share: batch share of output tokens (target ≥ weighted)", "share",
         ["tab:gray", "tab:blue"] * len(SHARE_WEIGHTS))
    bars(ax_ten, ["A floods", "A at its cap"], [val("tenant_flood", "B.ttft_p95_ms"), val("tenant_cap", "B.ttft_p95_ms")],
         f"tenants: B's TTFT p95 (target: flood ≤ {TENANT_RATIO_MAX:g}× cap)\nA's 429 {TENANT_LIMIT} per run "
         f"when it floods: {_fmt(val('tenant_flood', 'A.' + TENANT_LIMIT))}", "ms")
    cfg = report.get("config", {})
    fig.suptitle(f"flotilla-bench priorities — tiny, {cfg.get('slots')} slots, median of {cfg.get('runs')} run(s)")
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(redraw_main(sys.argv[1:], __spec__.name, plot))
