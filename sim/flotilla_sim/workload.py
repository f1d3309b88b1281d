"""Workloads: the trace file format, the Azure traces, and the synthetic generators.

Two shapes, one per fidelity (docs/simulation.md, "Workloads"):
- `Trace`: one row per request (arrival_s, model, prompt_tokens, output_tokens), for the request level;
- `Binned`: arrivals counted per tick per model with the tick's mean token lengths, for the fluid mode.
A fleet day has ~10^10 requests, so `fleet_day` builds a `Binned` directly and never lists requests.

Trace file format: CSV with the header `arrival_s,model,prompt_tokens,output_tokens`; arrival_s is
seconds from the trace start (float, any order), model an integer index into the catalogue.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from flotilla_sim.errors import InputError

QUANTILES = 8
TRACE_COLUMNS = ("arrival_s", "model", "prompt_tokens", "output_tokens")
MAX_INT32 = 2**31 - 1  # models and token counts are held as int32
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
AZURE_FILE = "azure-llm-2023-{name}.csv"
TRACES_ENV = "FLOTILLA_TRACES"  # a directory of Azure traces in place of the shipped copy
SHIPPED_TRACES = Path(__file__).resolve().parent / "traces"  # package data (pyproject.toml)
DAY_S = 86400.0
HOUR_S = 3600.0


@dataclass(frozen=True)
class Trace:
    arrival_s: np.ndarray  # float64, sorted
    model: np.ndarray  # int32
    prompt_tokens: np.ndarray  # int32
    output_tokens: np.ndarray  # int32

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def num_models(self) -> int:
        return int(self.model.max()) + 1 if len(self) else 0


@dataclass(frozen=True)
class Binned:
    tick_s: float
    arrivals: np.ndarray  # float64 [ticks, models]: requests arriving in each tick
    prompt_tokens: np.ndarray  # float64 [ticks]: mean prompt length of the tick's arrivals
    output_tokens: np.ndarray  # float64 [ticks]
    # QUANTILES equal-weight points of the tick's prompt and output lengths, so latencies keep the
    # trace's spread (a p50 of prefill times is not the prefill time of the mean prompt)
    prompt_points: np.ndarray | None = None  # float64 [ticks, QUANTILES]
    output_points: np.ndarray | None = None


def make_trace(arrival_s, model, prompt_tokens, output_tokens) -> Trace:
    order = np.argsort(np.asarray(arrival_s, dtype=np.float64), kind="stable")
    return Trace(
        np.asarray(arrival_s, dtype=np.float64)[order],
        np.asarray(model, dtype=np.int32)[order],
        np.asarray(prompt_tokens, dtype=np.int32)[order],
        np.asarray(output_tokens, dtype=np.int32)[order],
    )


def read_trace(path: Path | str) -> Trace:
    """A trace in the documented CSV format; InputError names the file, the line and what to change."""
    header, rows = _read_csv(path, "pass a trace file in the documented CSV format (flotilla-sim generate writes one)")
    if header is None:
        raise InputError(f"{path} is empty; its first line must be the header {','.join(TRACE_COLUMNS)}")
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise InputError(f"{path}: the header is {','.join(header)!r}, which lacks {', '.join(missing)}; "
                         f"the first line must be {','.join(TRACE_COLUMNS)} (docs/simulation.md, \"Workloads\")")
    if not rows:
        raise InputError(f"{path} holds no requests; add one line per request below the header")
    index = [header.index(c) for c in TRACE_COLUMNS]
    values = np.empty((len(rows), len(TRACE_COLUMNS)))
    for i, (line, row) in enumerate(rows):
        try:
            values[i] = [float(row[j]) for j in index]
        except (IndexError, ValueError):
            raise InputError(f"{path}, line {line}: {','.join(row)!r} is not {len(TRACE_COLUMNS)} numbers under "
                             f"{','.join(TRACE_COLUMNS)}; fix or remove the line") from None
    for column, (bad, rule) in zip(TRACE_COLUMNS, _row_rules(values), strict=True):
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            value = values[first, TRACE_COLUMNS.index(column)]
            raise InputError(f"{path}, line {rows[first][0]}: {column} is {value:g}; {rule}; "
                             "fix or remove the line")
    return make_trace(*values.T)


def _row_rules(values: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """Per column, which rows break its rule, and the rule in words."""
    arrival_s = values[:, 0]

    def whole(column: int, low: int) -> np.ndarray:
        v = values[:, column]
        return (v != np.floor(v)) | (v < low) | (v > MAX_INT32)

    return [
        (~np.isfinite(arrival_s) | (arrival_s < 0), "it must be seconds from the trace start, 0 or more"),
        (whole(1, 0), f"it must be the model's index in the catalogue, a whole number from 0 to {MAX_INT32:,}"),
        (whole(2, 1), f"it must be a whole number of tokens from 1 to {MAX_INT32:,}"),
        (whole(3, 1), f"it must be a whole number of tokens from 1 to {MAX_INT32:,}"),
    ]


def _read_csv(path: Path | str, fix: str) -> tuple[list[str] | None, list[tuple[int, list[str]]]]:
    """The header and the (line number, fields) of each non-blank row; InputError if the file cannot be read."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:  # -sig: a spreadsheet's byte-order mark
            reader = csv.reader(handle)
            header = next(reader, None)
            rows = [(reader.line_num, row) for row in reader if row]
        header = [name.strip() for name in header] if header is not None else None  # "a, b" names b
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise InputError(f"cannot read {path} ({reason}); {fix}") from None
    return header, rows


def write_trace(trace: Trace, path: Path | str) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TRACE_COLUMNS)
        for row in zip(trace.arrival_s, trace.model, trace.prompt_tokens, trace.output_tokens, strict=True):
            writer.writerow((f"{row[0]:.6f}", int(row[1]), int(row[2]), int(row[3])))


def azure_traces() -> Path:
    """$FLOTILLA_TRACES if set, else the copy shipped in this package (traces/, CC BY 4.0: traces/README.md)."""
    override = os.environ.get(TRACES_ENV)
    if not override:
        return SHIPPED_TRACES
    if not Path(override).is_dir():
        raise InputError(f"{TRACES_ENV}={override} is not a directory; point it at a directory holding "
                         f"{AZURE_FILE.format(name='conv')} and {AZURE_FILE.format(name='code')}, or unset it "
                         "to use the traces shipped with flotilla-sim")
    return Path(override)


def read_azure(name: str = "conv", directory: Path | str | None = None) -> Trace:
    """An Azure LLM inference trace 2023 (CC BY 4.0; Patel et al., Splitwise, ISCA 2024), all on model 0."""
    path = Path(directory or azure_traces()) / AZURE_FILE.format(name=name)
    if directory:
        fix = f"pass a directory holding {path.name}"
    elif os.environ.get(TRACES_ENV):
        fix = f"put {path.name} in {TRACES_ENV}'s directory, or unset {TRACES_ENV} to use the shipped traces"
    else:
        fix = (f"this install lacks its shipped traces: reinstall flotilla, or set {TRACES_ENV} to a directory "
               f"holding {path.name}")
    header, rows = _read_csv(path, fix)
    missing = [c for c in AZURE_COLUMNS if c not in (header or [])]
    if missing or not rows:
        raise InputError(f"{path} is not an Azure LLM inference trace 2023 (header {','.join(header or [])!r}, "
                         f"{len(rows)} rows); {fix}")
    stamp, context, generated = (header.index(c) for c in AZURE_COLUMNS)
    try:
        stamps = [datetime.fromisoformat(row[stamp][:26]).timestamp() for _, row in rows]
        prompts = [int(row[context]) for _, row in rows]
        outputs = [max(int(row[generated]), 1) for _, row in rows]
    except (IndexError, ValueError) as error:
        raise InputError(f"{path} is not an Azure LLM inference trace 2023 ({error}); {fix}") from None
    start = min(stamps)
    return make_trace([s - start for s in stamps], [0] * len(rows), prompts, outputs)


# --- generators -------------------------------------------------------------------------------------

def zipf_weights(num_models: int, s: float = 1.0) -> np.ndarray:
    weights = 1.0 / np.arange(1, num_models + 1) ** s
    return weights / weights.sum()


def poisson(rate_per_s: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    count = rng.poisson(rate_per_s * duration_s)
    return np.sort(rng.uniform(0.0, duration_s, count))


def on_off(rate_on_per_s: float, on_s: float, off_s: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson bursts of `on_s` at `rate_on_per_s`, separated by `off_s` of silence."""
    times = poisson(rate_on_per_s, duration_s, rng)
    return times[(times % (on_s + off_s)) < on_s]


def diurnal_multiplier(t_s, trough: float = 0.25, peak_hour: float = 14.0):
    """A day's rate multiplier in [trough, 1]: a cosine with its peak at `peak_hour` local time."""
    phase = 2 * np.pi * (np.asarray(t_s) / HOUR_S - peak_hour) / 24.0
    return trough + (1 - trough) * (1 + np.cos(phase)) / 2


def diurnal(peak_rate_per_s: float, duration_s: float, rng: np.random.Generator, trough: float = 0.25) -> np.ndarray:
    """A non-homogeneous Poisson process under `diurnal_multiplier`, by thinning."""
    times = poisson(peak_rate_per_s, duration_s, rng)
    return times[rng.uniform(size=len(times)) < diurnal_multiplier(times, trough)]


def synthetic(arrival_s: np.ndarray, num_models: int, rng: np.random.Generator, prompt_tokens: int = 512,
              output_tokens: int = 128, zipf_s: float = 1.0) -> Trace:
    """Requests at `arrival_s`, spread over `num_models` by Zipf, with exponential token lengths."""
    n = len(arrival_s)
    model = rng.choice(num_models, size=n, p=zipf_weights(num_models, zipf_s))
    prompts = np.maximum(rng.exponential(prompt_tokens, n).astype(np.int32), 1)
    outputs = np.maximum(rng.exponential(output_tokens, n).astype(np.int32), 1)
    return make_trace(arrival_s, model, prompts, outputs)


def bin_trace(trace: Trace, tick_s: float, duration_s: float | None = None, num_models: int | None = None) -> Binned:
    duration_s = duration_s if duration_s is not None else float(trace.arrival_s[-1]) + tick_s
    ticks = max(math.ceil(duration_s / tick_s), 1)
    models = num_models or trace.num_models
    idx = np.minimum((trace.arrival_s / tick_s).astype(np.int64), ticks - 1)
    arrivals = np.zeros((ticks, models))
    np.add.at(arrivals, (idx, trace.model), 1.0)
    count = np.bincount(idx, minlength=ticks)
    safe = np.maximum(count, 1)
    prompts = np.bincount(idx, trace.prompt_tokens, minlength=ticks) / safe
    outputs = np.bincount(idx, trace.output_tokens, minlength=ticks) / safe
    # a tick with no arrivals borrows the trace's means, so a service time is always defined
    prompts[count == 0] = trace.prompt_tokens.mean() if len(trace) else 1.0
    outputs[count == 0] = trace.output_tokens.mean() if len(trace) else 1.0
    return Binned(tick_s, arrivals, prompts, outputs, _points(idx, trace.prompt_tokens, prompts, ticks),
                  _points(idx, trace.output_tokens, outputs, ticks))


def _points(idx: np.ndarray, tokens: np.ndarray, means: np.ndarray, ticks: int) -> np.ndarray:
    """Per tick, QUANTILES equal-weight quantile points of `tokens` (the mean where a tick is empty)."""
    points = np.repeat(means[:, None], QUANTILES, axis=1).astype(np.float64)
    levels = (np.arange(QUANTILES) + 0.5) / QUANTILES
    order = np.lexsort((tokens, idx))
    starts = np.searchsorted(idx[order], np.arange(ticks + 1))
    for t in np.flatnonzero(np.diff(starts) > 0):
        points[t] = np.quantile(tokens[order[starts[t]:starts[t + 1]]], levels)
    return points


def fleet_day(base: Trace, num_models: int, tick_s: float, rate_scale: float, rng: np.random.Generator,
              zipf_s: float = 1.0, trough: float = 0.25) -> Binned:
    """One day: `base` (about an hour) tiled 24 times under the diurnal multiplier, its rate multiplied
    by `rate_scale`, each tick's arrivals split over the catalogue by Zipf (Poisson counts, seeded)."""
    hour = bin_trace(base, tick_s, HOUR_S, 1)
    per_hour = hour.arrivals.shape[0]
    ticks = per_hour * 24
    t_s = (np.arange(ticks) + 0.5) * tick_s
    expected = np.tile(hour.arrivals[:, 0], 24) * diurnal_multiplier(t_s, trough) * rate_scale
    arrivals = rng.poisson(np.outer(expected, zipf_weights(num_models, zipf_s))).astype(np.float64)
    return Binned(tick_s, arrivals, np.tile(hour.prompt_tokens, 24), np.tile(hour.output_tokens, 24),
                  np.tile(hour.prompt_points, (24, 1)), np.tile(hour.output_points, (24, 1)))


def expected_day(base: Trace, num_models: int, tick_s: float, zipf_s: float = 1.0, trough: float = 0.25) -> Binned:
    """`fleet_day` at rate_scale 1 without the Poisson draw: the expectation, for sizing the fleet."""
    hour = bin_trace(base, tick_s, HOUR_S, 1)
    ticks = hour.arrivals.shape[0] * 24
    t_s = (np.arange(ticks) + 0.5) * tick_s
    expected = np.tile(hour.arrivals[:, 0], 24) * diurnal_multiplier(t_s, trough)
    return Binned(tick_s, np.outer(expected, zipf_weights(num_models, zipf_s)),
                  np.tile(hour.prompt_tokens, 24), np.tile(hour.output_tokens, 24),
                  np.tile(hour.prompt_points, (24, 1)), np.tile(hour.output_points, (24, 1)))
