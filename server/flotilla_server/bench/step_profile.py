"""`flotilla-bench steps`: where a decode step's time goes, at batch 1, 8 and 64.

Throughput figures say how fast; this says why. For each model and batch size, `batch` requests with
`--context`-token prompts are prefilled, and then `--steps` pure decode steps are timed twice:

- plain: the engine as it serves (step time, decode tokens/s and tokens per CPU-second of this process,
  steadier on a shared machine; forward_fraction);
- split: the same steps with timers wrapped around the forward pass's parts. The engine reports the
  rest of the step itself (StepRecord: schedule, prepare, sample, update, detokenize); the wrappers time
  the KV gather, the KV write, attention (SDPA) and the logits inside the forward. On the native float32 CPU
  path a decode step's attention is one op that also rotates q and k and writes the KV (model/decode_ops.py,
  reading K and V through the block tables: no gather), so there it all counts as attention and the gather
  and the KV write read 0. Each wrapper costs a microsecond or so per call, so the split's step is a little
  slower than the plain one.

The hand-off to HTTP is not part of the engine and is not measured here (see `flotilla-bench modes`).
The figures go to stdout as a table and, with --json, to a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from flotilla_contract.flags import DEFAULT_BLOCK_SIZE, DTYPES, QUANTIZATIONS

from flotilla_server.bench.workloads import build_model, num_parameters
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.outputs import StepRecord
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import DecoderModel, KVCacheTensors, LoadedModel, decode_ops

MODELS = ("tiny", "llama-100m", "smollm2")
ENGINE_PARTS = ("schedule_s", "prepare_s", "sample_s", "update_s", "detokenize_s")
FORWARD_PARTS = ("gather_s", "kv_write_s", "attention_s", "logits_s")


class _Timers:
    """Seconds spent in each wrapped callable, summed over a step."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Any) -> Any:
        totals = self.totals

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - start

        return timed


class _TimedNativeOps:
    """decode_ops.native with its fused decode attention timed as attention; every other op as it is."""

    def __init__(self, ops: Any, timers: _Timers) -> None:
        self._ops = ops
        self.decode_attention = timers.wrap("attention_s", ops.decode_attention)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)


@contextmanager
def _forward_timers(timers: _Timers) -> Iterator[None]:
    """Wraps the forward pass's parts for the duration (bench only; restored on exit)."""
    patched = [
        (KVCacheTensors, "gather_blocks", "gather_s"),
        (KVCacheTensors, "write", "kv_write_s"),
        (F, "scaled_dot_product_attention", "attention_s"),
        (DecoderModel, "compute_logits", "logits_s"),
    ]
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patched]
    native = decode_ops.native
    try:
        for owner, attr, name in patched:
            setattr(owner, attr, timers.wrap(name, getattr(owner, attr)))
        if native is not None:
            decode_ops.native = _TimedNativeOps(native, timers)
        yield
    finally:
        for owner, attr, fn in originals:
            setattr(owner, attr, fn)
        decode_ops.native = native


def _decode_engine(loaded: LoadedModel, name: str, batch: int, context: int, steps: int,
                   dtype: str) -> tuple[EngineCore, list[StepRecord]]:
    """An engine with `batch` sequences past their prefill, each with room for `steps` more tokens
    (twice: plain and split) plus warm-up steps; and the list its step records go to."""
    blocks_per_seq = -(-(context + 2 * steps + 16) // DEFAULT_BLOCK_SIZE) + 1
    config = EngineConfig(model=name, max_num_seqs=batch, max_num_batched_tokens=max(2048, context, batch),
                          num_kv_blocks=batch * blocks_per_seq, dtype=dtype)
    engine = EngineCore(config, loaded=loaded)
    vocab = loaded.config.vocab_size
    params = SamplingParams(max_tokens=2 * steps + 12, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = [(7 * i + 13 * j) % (vocab - 4) for j in range(context)]
        engine.add_request(str(i), prompt, params)
    records: list[StepRecord] = []
    engine.add_step_listener(records.append)
    while not records or records[-1].num_prefill_seqs or records[-1].num_decode_seqs < batch:
        engine.step()
    for _ in range(3):  # warm-up decode steps
        engine.step()
    return engine, records


def _time_steps(engine: EngineCore, all_records: list[StepRecord], steps: int,
                timers: _Timers | None) -> dict[str, float]:
    """Median seconds per step of each part over `steps` decode steps."""
    first = len(all_records)
    forward_parts: list[dict[str, float]] = []
    cpu: list[float] = []
    for _ in range(steps):
        if timers is not None:
            timers.totals.clear()
        cpu_start = time.process_time()
        engine.step()
        cpu.append(time.process_time() - cpu_start)
        if timers is not None:
            forward_parts.append(dict(timers.totals))
    records = all_records[first:]
    if any(r.num_prefill_seqs for r in records):
        raise RuntimeError("a timed step held a prefill; the profile times decode steps only")
    out = {"step_s": statistics.median(r.duration_s for r in records),
           "forward_s": statistics.median(r.forward_s for r in records),
           "cpu_s": statistics.median(cpu)}
    for part in ENGINE_PARTS:
        out[part] = statistics.median(getattr(r, part, 0.0) for r in records)
    if timers is not None:
        for part in FORWARD_PARTS:
            out[part] = statistics.median(p.get(part, 0.0) for p in forward_parts)
        out["forward_rest_s"] = out["forward_s"] - sum(out[p] for p in FORWARD_PARTS)
    out["other_s"] = out["step_s"] - out["forward_s"] - sum(out[p] for p in ENGINE_PARTS)
    return out


def profile(model: str, batches: list[int], context: int, steps: int, log: Any,
            dtype: str = "float32", quantization: str | None = None) -> dict[str, Any]:
    loaded = build_model(model, dtype=dtype, quantization=quantization)
    held = loaded.model.weight_bytes() if isinstance(loaded.model, DecoderModel) else 0
    how = loaded.model.quantization() if isinstance(loaded.model, DecoderModel) else "none"
    log(f"[{model}] {num_parameters(loaded.model) / 1e6:.1f}M parameters outside blocks, weights held as {how}: "
        f"{held / 2**20:.1f} MiB")
    out: dict[str, Any] = {"parameters": num_parameters(loaded.model), "weight_bytes": held, "quantization": how,
                           "batches": {}}
    for batch in batches:
        engine, records = _decode_engine(loaded, model, batch, context, steps, dtype)
        plain = _time_steps(engine, records, steps, None)
        timers = _Timers()
        with _forward_timers(timers):
            split = _time_steps(engine, records, steps, timers)
        out["batches"][str(batch)] = {
            "decode_tokens_per_s": batch / plain["step_s"],
            "decode_tokens_per_cpu_s": batch / plain["cpu_s"] if plain["cpu_s"] else 0.0,
            "forward_fraction": plain["forward_s"] / plain["step_s"],
            "plain": plain,
            "split": split,
        }
        log(f"[{model}] batch {batch}: {plain['step_s'] * 1e3:.2f} ms/step, {batch / plain['step_s']:.1f} tokens/s")
        del engine
    return out


def print_table(report: dict[str, Any]) -> None:
    cols = ["step", "forward", *(p[:-2] for p in FORWARD_PARTS), "fwd_rest",
            *(p[:-2] for p in ENGINE_PARTS), "other"]
    print(f"{'model':11s} {'batch':>5s} {'tok/s':>8s} {'tok/cpu-s':>9s} {'fwd_frac':>8s} "
          + " ".join(f"{c:>10s}" for c in cols))
    for model, m in report["models"].items():
        for batch, b in m["batches"].items():
            s = b["split"]
            values = [b["plain"]["step_s"], s["forward_s"], *(s[p] for p in FORWARD_PARTS), s["forward_rest_s"],
                      *(s[p] for p in ENGINE_PARTS), s["other_s"]]
            print(f"{model:11s} {batch:>5s} {b['decode_tokens_per_s']:8.1f} {b['decode_tokens_per_cpu_s']:9.1f} "
                  f"{b['forward_fraction']:8.3f} "
                  + " ".join(f"{v * 1e3:10.3f}" for v in values))
    print("milliseconds per decode step (median); `step` is the plain run, the parts the split run "
          f"(threads={report['threads']}, {report['dtype']}, context {report['context']}, {report['steps']} steps)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--model", action="append", choices=MODELS, default=None,
      help="Profile this model (repeatable); default: tiny and llama-100m (smollm2 needs `make model`).")
    a("--batch", action="append", type=int, default=None, help="Decode batch size (repeatable); default: 1, 8, 64.")
    a("--context", type=int, default=128, help="Prompt tokens of each sequence before the timed steps.")
    a("--steps", type=int, default=32, help="Decode steps timed per batch size (each twice: plain and split).")
    a("--threads", type=int, default=1, help="torch CPU threads; 0: torch's own choice.")
    a("--dtype", choices=DTYPES, default="float32", help="Weights and KV-cache dtype.")
    a("--quantization", choices=QUANTIZATIONS, default=None,
      help="How smollm2's GGUF weights are held (default: the server's, gguf: its blocks kept).")
    a("--json", type=Path, default=None, help="Write the figures here as JSON.")
    a("--plot", type=Path, default=None, help="Draw each step's parts here as a PNG.")


def run(args: argparse.Namespace) -> int:
    if args.threads < 0 or args.steps < 1 or args.context < 1 or any(b < 1 for b in args.batch or []):
        print("flotilla-bench steps: --threads must be >= 0, --steps, --context and --batch >= 1", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"{time.perf_counter() - started:7.1f}s {msg}", file=sys.stderr, flush=True)

    batches = args.batch or [1, 8, 64]
    report: dict[str, Any] = {"threads": torch.get_num_threads(), "context": args.context, "steps": args.steps,
                              "dtype": args.dtype, "quantization": args.quantization}
    report["models"] = {m: profile(m, batches, args.context, args.steps, log, args.dtype, args.quantization)
                        for m in args.model or MODELS[:2]}
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        from flotilla_server.bench.steps_plot import plot_steps

        plot_steps(report, args.plot)
    return 0
