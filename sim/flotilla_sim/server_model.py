"""The server model: step time as a function of batch and tokens, load time as a function of size.

The simulator never runs a model; it needs how long one engine step takes and how long a replica
takes to load. Two sources (docs/simulation.md, "Server model"):
- `fit_bench`: a least-squares line fitted to `flotilla-bench` JSON (docs/bench/*.json), measured;
- `roofline`: a GPU roofline MODEL, not a measurement: a step takes the larger of weight bytes /
  (memory bandwidth x efficiency) and 2 x parameters x tokens / (peak FLOP/s x efficiency).
Every output carries `source`, so a modelled figure is never mistaken for a measured one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flotilla_contract.flags import (
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_QUEUE_DEPTH_PER_SLOT,
    DEFAULT_QUEUE_TIMEOUT_S,
)

from flotilla_sim.errors import InputError

# The roofline's parameters: an 8B model in bf16 on an H100-class GPU (docs/simulation.md).
H100_BANDWIDTH_BYTES_PER_S = 3.35e12
H100_BF16_FLOPS = 990e12
BANDWIDTH_EFFICIENCY = 0.6
COMPUTE_EFFICIENCY = 0.5
LOCAL_DISK_BYTES_PER_S = 2e9
POD_START_S = 5.0  # scheduling, image already cached, container start: before weights load
_PROFILE_FIX = "pass a directory of flotilla-bench JSON such as docs/bench, or roofline (the H100 model)"
_BENCH_FILE_FIX = "rerun flotilla-bench to rewrite it, or move it out of the directory, or pass roofline"


@dataclass(frozen=True)
class ServerProfile:
    """One replica of one model: its step time, its slots and its admission bounds."""

    source: str  # "roofline model: ..." or "measured: docs/bench/..."
    weight_bytes: float
    params: float
    slots: int = DEFAULT_MAX_NUM_SEQS
    queue_per_slot: int = DEFAULT_QUEUE_DEPTH_PER_SLOT
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    # linear profile (fit_bench): step_s = base + per_seq x batch + per_token x prefill tokens
    step_base_s: float = 0.0
    step_per_seq_s: float = 0.0
    step_per_token_s: float = 0.0
    # roofline profile: step_s = max(memory_s, 2 x params x tokens / flops)
    memory_s: float = 0.0
    flops: float = 0.0
    load_s: float = 0.0  # weights to device; pod start comes on top (start_s)
    pod_start_s: float = POD_START_S  # creation to the server process starting to load

    @property
    def queue_capacity(self) -> int:
        return self.slots * self.queue_per_slot

    @property
    def start_s(self) -> float:
        """From pod creation to ready: pod start plus weight load."""
        return self.pod_start_s + self.load_s

    def step_s(self, batch, prefill_tokens=0.0):
        """Seconds for one engine step running `batch` decodes plus `prefill_tokens` prompt tokens.

        Works on floats and numpy arrays alike (the fluid mode passes arrays)."""
        if self.flops > 0:
            compute_s = 2.0 * self.params * (batch + prefill_tokens) / self.flops
            return _maximum(self.memory_s, compute_s)
        return self.step_base_s + self.step_per_seq_s * batch + self.step_per_token_s * prefill_tokens

    def to_dict(self) -> dict:
        return asdict(self)


def _maximum(a, b):
    try:
        import numpy as np

        return np.maximum(a, b)
    except ImportError:  # pragma: no cover - numpy is a dependency of the simulator
        return max(a, b)


def roofline(
    params: float = 8e9,
    bytes_per_param: float = 2.0,
    bandwidth_bytes_per_s: float = H100_BANDWIDTH_BYTES_PER_S,
    flops: float = H100_BF16_FLOPS,
    slots: int = DEFAULT_MAX_NUM_SEQS,
) -> ServerProfile:
    weight_bytes = params * bytes_per_param
    return ServerProfile(
        source=(f"roofline model (not measured): {params / 1e9:g}B params x {bytes_per_param:g} bytes, "
                f"{bandwidth_bytes_per_s / 1e12:g} TB/s x {BANDWIDTH_EFFICIENCY}, "
                f"{flops / 1e12:g} TFLOP/s x {COMPUTE_EFFICIENCY}, load at {LOCAL_DISK_BYTES_PER_S / 1e9:g} GB/s"),
        weight_bytes=weight_bytes,
        params=params,
        slots=slots,
        memory_s=weight_bytes / (bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY),
        flops=flops * COMPUTE_EFFICIENCY,
        load_s=weight_bytes / LOCAL_DISK_BYTES_PER_S,
    )


def _points(bench_dir: Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]], dict]:
    """(batch, step_s) points and (prompt tokens, prefill_s) points from the bench JSON files."""
    if not bench_dir.is_dir():
        raise InputError(f"{bench_dir} is not a directory; {_PROFILE_FIX}")
    decode: list[tuple[float, float]] = []
    prefill: list[tuple[float, float]] = []
    model: dict = {}
    served = set()
    for path in sorted(bench_dir.glob("online-*.json")):
        with _bench_file(path) as document:
            summary = document["summary"]
            config = summary["config"]
            served.add(config["model"])
            decode.append((float(config["concurrency"] or 1), summary["tpot_ms"]["p50"] / 1e3))
            if config["concurrency"] == 1:  # no queueing: TTFT is the prefill step alone
                mean_prompt = (config["prompt_len_min"] + config["prompt_len_max"]) / 2
                prefill.append((mean_prompt, summary["ttft_ms"]["p50"] / 1e3))
    offline = bench_dir / "offline.json"
    if offline.exists():
        with _bench_file(offline) as document:
            for workload in document["workloads"].values():
                if served and workload["model"]["name"] not in served:
                    continue  # one model per profile: the one the online runs served
                run = workload["modes"]["continuous"]
                decode.append((run["output_tokens"] / run["steps"], run["duration_s"] / run["steps"]))
                model = workload["model"]
    return decode, prefill, model


@contextmanager
def _bench_file(path: Path) -> Iterator[Any]:
    """The parsed JSON of one flotilla-bench result; InputError if it cannot be read, parsed or used."""
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path} is not readable JSON ({error}); {_BENCH_FILE_FIX}") from None
    try:
        yield document
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as error:
        raise InputError(f"{path} is not a flotilla-bench result ({type(error).__name__}: {error}); "
                         f"{_BENCH_FILE_FIX}") from None


def fit_bench(bench_dir: Path | str = "docs/bench") -> ServerProfile:
    """A linear step-time profile fitted to flotilla-bench JSON (the CPU figures of `make bench`)."""
    decode, prefill, model = _points(Path(bench_dir))
    if len(decode) < 2:
        raise InputError(f"{bench_dir} holds {len(decode)} flotilla-bench step-time results (online-*.json, "
                         f"offline.json), and a fit needs at least two; {_PROFILE_FIX}")
    n = len(decode)
    mean_b = sum(b for b, _ in decode) / n
    mean_t = sum(t for _, t in decode) / n
    var = sum((b - mean_b) ** 2 for b, _ in decode)
    per_seq = sum((b - mean_b) * (t - mean_t) for b, t in decode) / var if var > 0 else 0.0
    base = max(mean_t - per_seq * mean_b, 0.0)
    per_token = 0.0
    if prefill:
        per_token = max(sum(max(t - base - per_seq, 0.0) / p for p, t in prefill) / len(prefill), 0.0)
    params = float(model.get("parameters", 2.87e6))
    weight_bytes = params * 4  # float32 on CPU
    return ServerProfile(
        source=f"measured: flotilla-bench JSON in {bench_dir} ({n} decode points, linear least squares)",
        weight_bytes=weight_bytes,
        params=params,
        step_base_s=base,
        step_per_seq_s=per_seq,
        step_per_token_s=per_token,
        load_s=weight_bytes / LOCAL_DISK_BYTES_PER_S,
    )


def service_s(profile: ServerProfile, batch, prompt_tokens, output_tokens):
    """Seconds one request holds a slot at a steady batch: its prefill step plus one step per output token."""
    return profile.step_s(batch, prompt_tokens) + output_tokens * profile.step_s(batch)


def replicas_for(in_flight: float, per_replica: float) -> int:
    return max(math.ceil(in_flight / per_replica - 1e-9), 0)
