"""`flotilla-bench offline`: what continuous batching buys, measured on the engine itself.

One workload runs in four modes on the same model and engine settings:

- `continuous`: every request queued at once; the scheduler admits and retires them step by step.
- `static`: classic static batching (transformers `generate`, FasterTransformer, the Orca paper's
  baseline): fixed batches of `static_batch` requests, each batch a rectangle. Every prompt is
  left-padded with `PAD_TOKEN_ID` to the batch's longest prompt and every member generates the batch's
  longest output; only each request's own output tokens count. The next batch starts when one ends.
- `static_unpadded`: the same batches without prompt padding (each prompt is prefilled at its own
  length; outputs still run to the batch's longest): a kinder static baseline, reported beside it.
- `sequential`: one request at a time (every `sequential_stride`-th request: the rate is per token).
- `transformers`: the same weights through `transformers` `generate`, static batches, left padding
  (the first `transformers_batches` batches of `transformers_batch` requests: a rate, sampled to fit).

Figures: output tokens/s per mode; `kv_utilization` (positions holding tokens ÷ positions allocated,
averaged over saturated steps: all slots busy or requests waiting) and `forward_fraction` (model
forward time ÷ step time, over continuous steps at a full batch of `max_num_seqs` sequences).
Wall-clock rates are the figures; rates per CPU-second of this process are reported beside them
because they stay steady when other work shares the machine (with one thread they coincide).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flotilla_contract.flags import DTYPES

from flotilla_server.bench.offline_report import plot_results, print_table
from flotilla_server.bench.workloads import (
    QUICK_WORKLOADS,
    WORKLOADS,
    Request,
    Workload,
    build_model,
    make_requests,
    num_parameters,
    to_transformers,
)
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.outputs import StepRecord
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import LoadedModel

MODES = ("continuous", "static", "static_unpadded", "sequential", "transformers")
# the rectangle's padding token: the id the `transformers` mode pads with too (cost matters, not content)
PAD_TOKEN_ID = 0
# One thread by default: on a 2-core machine shared with other work, two threads spin-wait on each other
# and every mode slows several-fold (tiny, continuous: 2308 tokens/s with one thread, 304 with two).
DEFAULT_THREADS = 1


@dataclass
class ModeResult:
    requests: int = 0
    output_tokens: int = 0  # useful tokens: each request's own output length
    duration_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time: steadier than wall time on a shared machine
    steps: list[StepRecord] = field(default_factory=list)
    preemptions: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "output_tokens_per_s": self.output_tokens / self.duration_s if self.duration_s else 0.0,
            "output_tokens": self.output_tokens,
            "requests": self.requests,
            "duration_s": round(self.duration_s, 3),
            "output_tokens_per_cpu_s": self.output_tokens / self.cpu_s if self.cpu_s else 0.0,
            "cpu_s": round(self.cpu_s, 3),
            "steps": len(self.steps),
            "preemptions": self.preemptions,
        }


def engine_config(workload: Workload, loaded: LoadedModel, device: str = "cpu", dtype: str = "float32") -> EngineConfig:
    return EngineConfig(model=workload.model, max_num_seqs=workload.max_num_seqs, device=device, dtype=dtype)


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _drain(engine: EngineCore) -> None:
    while engine.has_unfinished():
        engine.step()


def left_padded(prompts: list[list[int]], pad_token_id: int) -> list[list[int]]:
    """Each prompt left-padded with `pad_token_id` to the longest: a static batch's rectangle."""
    width = max(len(p) for p in prompts)
    return [[pad_token_id] * (width - len(p)) + p for p in prompts]


def run_engine_mode(mode: str, workload: Workload, loaded: LoadedModel, requests: list[Request],
                    device: str = "cpu", dtype: str = "float32") -> ModeResult:
    engine = EngineCore(engine_config(workload, loaded, device, dtype), loaded=loaded)
    result = ModeResult()
    engine.add_step_listener(result.steps.append)
    start, cpu_start = time.perf_counter(), time.process_time()
    if mode == "continuous":
        for i, r in enumerate(requests):
            engine.add_request(str(i), r.prompt_token_ids, _params(r.output_len))
        _drain(engine)
        done = requests
    elif mode in ("static", "static_unpadded"):
        for b in range(0, len(requests), workload.static_batch):
            batch = requests[b : b + workload.static_batch]
            longest = max(r.output_len for r in batch)
            prompts = [r.prompt_token_ids for r in batch]
            if mode == "static":
                prompts = left_padded(prompts, PAD_TOKEN_ID)
            for i, prompt in enumerate(prompts):
                engine.add_request(f"{b}-{i}", prompt, _params(longest))
            _drain(engine)
        done = requests
    elif mode == "sequential":
        done = requests[:: workload.sequential_stride]
        for i, r in enumerate(done):
            engine.add_request(str(i), r.prompt_token_ids, _params(r.output_len))
            _drain(engine)
    else:
        raise ValueError(f"unknown engine mode {mode!r}")
    result.duration_s = time.perf_counter() - start
    result.cpu_s = time.process_time() - cpu_start
    result.requests = len(done)
    result.output_tokens = sum(r.output_len for r in done)
    result.preemptions = engine.scheduler.preemptions
    return result


@torch.inference_mode()
def run_transformers(workload: Workload, hf_model: Any, requests: list[Request], device: str = "cpu") -> ModeResult:
    size = workload.transformers_batch or workload.static_batch
    batches = [requests[b : b + size] for b in range(0, len(requests), size)]
    batches = batches[: workload.transformers_batches]
    result = ModeResult()
    start, cpu_start = time.perf_counter(), time.process_time()
    for batch in batches:
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(batch):  # left padding: every prompt ends at the last column
            ids[i, width - len(r.prompt_token_ids) :] = torch.tensor(r.prompt_token_ids)
            mask[i, width - len(r.prompt_token_ids) :] = 1
        longest = max(r.output_len for r in batch)
        hf_model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=longest, min_new_tokens=longest,
                          do_sample=False, pad_token_id=0)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    result.duration_s = time.perf_counter() - start
    result.cpu_s = time.process_time() - cpu_start
    result.requests = sum(len(b) for b in batches)
    result.output_tokens = sum(r.output_len for b in batches for r in b)
    return result


def kv_utilization(steps: list[StepRecord], max_num_seqs: int) -> tuple[float | None, int]:
    saturated = [s for s in steps if (s.num_running >= max_num_seqs or s.num_waiting > 0) and s.kv_positions_allocated]
    if not saturated:
        return None, 0
    return sum(s.kv_positions_held / s.kv_positions_allocated for s in saturated) / len(saturated), len(saturated)


def forward_fraction(steps: list[StepRecord], max_num_seqs: int) -> tuple[float | None, int]:
    full = [s for s in steps if s.num_decode_seqs + s.num_prefill_seqs >= max_num_seqs]
    if not full:
        return None, 0
    return sum(s.forward_s for s in full) / sum(s.duration_s for s in full), len(full)


def run_workload(workload: Workload, modes: list[str], log: Any, device: str = "cpu",
                 dtype: str = "float32") -> dict[str, Any]:
    loaded = build_model(workload.model, device=device, dtype=dtype)
    requests = make_requests(workload, loaded.config.vocab_size)
    log(f"[{workload.name}] {num_parameters(loaded.model) / 1e6:.1f}M parameters; warming up")
    warm = EngineCore(engine_config(workload, loaded, device, dtype), loaded=loaded)
    for i, r in enumerate(requests[:2]):
        warm.add_request(str(i), r.prompt_token_ids, _params(4))
    _drain(warm)
    del warm
    results: dict[str, ModeResult] = {}
    for mode in modes:
        log(f"[{workload.name}] {mode} ...")
        if mode == "transformers":
            hf = to_transformers(loaded).to(device)
            run_transformers(workload, hf, requests[:1], device)  # warm-up
            results[mode] = run_transformers(workload, hf, requests, device)
            del hf
        else:
            results[mode] = run_engine_mode(mode, workload, loaded, requests, device, dtype)
        r = results[mode]
        log(f"[{workload.name}] {mode}: {r.output_tokens} tokens in {r.duration_s:.1f} s")
    out: dict[str, Any] = {
        "description": workload.description,
        "model": {"name": workload.model, "parameters": num_parameters(loaded.model)},
        "engine": {k: getattr(engine_config(workload, loaded, device, dtype), k)
                   for k in ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk", "block_size", "device", "dtype")},
        "static_batch": workload.static_batch,
        "transformers_batch": workload.transformers_batch or workload.static_batch,
        "modes": {m: r.as_dict() for m, r in results.items()},
    }
    if "continuous" in results:
        steps = results["continuous"].steps
        out["kv_utilization"], out["kv_utilization_steps"] = kv_utilization(steps, workload.max_num_seqs)
        out["forward_fraction"], out["forward_fraction_steps"] = forward_fraction(steps, workload.max_num_seqs)
        out["continuous_batch_by_step"] = [s.num_decode_seqs + s.num_prefill_seqs for s in steps]
        tps = {m: v["output_tokens_per_s"] for m, v in out["modes"].items()}
        out["ratios"] = {f"continuous_over_{m}": tps["continuous"] / tps[m] for m in tps if m != "continuous" and tps[m]}
        cpu = {m: v["output_tokens_per_cpu_s"] for m, v in out["modes"].items()}
        out["cpu_time_ratios"] = {f"continuous_over_{m}": cpu["continuous"] / cpu[m]
                                  for m in cpu if m != "continuous" and cpu[m]}
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--workload", action="append", choices=sorted({*WORKLOADS, *QUICK_WORKLOADS}), default=None,
      help="Run only this workload (repeatable); default: every workload of the chosen size.")
    a("--mode", action="append", choices=MODES, default=None, help="Run only this mode (repeatable).")
    a("--quick", action="store_true", help="A smoke run in seconds: small workloads, small batches.")
    a("--threads", type=int, default=DEFAULT_THREADS,
      help="torch CPU threads (default 1: steady figures on a shared machine); 0: torch's own choice.")
    a("--device", default="cpu", help="cpu or cuda[:N].")
    a("--dtype", default="float32", choices=DTYPES, help="Model and KV dtype.")
    a("--json", type=Path, default=None, help="Write the figures here as JSON.")
    a("--plot", type=Path, default=None, help="Write a PNG of throughput by mode here.")


def run(args: argparse.Namespace) -> int:
    table = QUICK_WORKLOADS if args.quick else WORKLOADS
    names = args.workload or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        size = "--quick" if args.quick else "the full run"
        print(f"flotilla-bench offline: workload {unknown[0]!r} is not part of {size}; choose from "
              f"{', '.join(table)}", file=sys.stderr)
        return 2
    if args.threads < 0:
        print("flotilla-bench offline: --threads must be >= 0 (0: torch's own choice)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = args.mode or list(MODES)
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"{time.perf_counter() - started:7.1f}s {msg}", file=sys.stderr, flush=True)

    report = {
        "quick": args.quick,
        "threads": torch.get_num_threads(),
        "device": args.device,
        "dtype": args.dtype,
        "workloads": {name: run_workload(table[name], modes, log, args.device, args.dtype) for name in names},
    }
    report["total_s"] = round(time.perf_counter() - started, 1)
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        plot_results(report, args.plot)
    return 0
