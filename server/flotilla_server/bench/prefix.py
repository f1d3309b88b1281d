"""`flotilla-bench prefix`: what prefix caching saves on traffic that repeats its system prompts.

Engine-direct (no HTTP), the same model and requests with caching on and off, runs interleaved (on, off,
on, off, ...) so that a shared machine's drift hits both alike; each figure is the median over the runs.
Workload (docs/benchmarks.md, "Prefix caching"): `--num-requests` requests built from `--num-prefixes`
distinct system prompts of `--prefix-len` tokens, each followed by a unique `--question-len`-token
question. Arrivals: one request per system prompt first (run to completion), then the rest at
concurrency `--concurrency`. The most caching can save is (all prompt tokens) / (each system prompt once
plus every question): about 5.2x on the default workload.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from flotilla_server.bench.workloads import build_model
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.outputs import StepRecord
from flotilla_server.engine.sampling_params import SamplingParams


def make_prompts(args: argparse.Namespace, vocab_size: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(vocab_size - 4) for _ in range(args.prefix_len)] for _ in range(args.num_prefixes)]
    return [prefixes[i % args.num_prefixes] + [rng.randrange(vocab_size - 4) for _ in range(args.question_len)]
            for i in range(args.num_requests)]


def run_once(loaded, args: argparse.Namespace, prompts: list[list[int]], caching: bool) -> dict:
    config = EngineConfig(model=loaded.name, max_num_seqs=args.concurrency, device=args.device,
                          enable_prefix_caching=caching, max_model_len=args.prefix_len + args.question_len + args.output_len)
    engine = EngineCore(config, loaded=loaded)
    prefill_tokens = 0

    def on_step(record: StepRecord) -> None:
        nonlocal prefill_tokens
        prefill_tokens += record.num_prefill_tokens

    engine.add_step_listener(on_step)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    added_s: dict[str, float] = {}
    ttft_s: dict[str, float] = {}
    output_tokens = 0

    def drain(limit: int) -> None:
        nonlocal output_tokens
        while sum(1 for r in added_s if r not in done) > limit:
            for out in engine.step():
                output_tokens += len(out.token_ids)
                ttft_s.setdefault(out.request_id, time.perf_counter() - added_s[out.request_id])
                if out.finished:
                    done.add(out.request_id)

    done: set[str] = set()
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        if i == args.num_prefixes:
            drain(0)  # the first request of each system prompt, alone, before the rest
        if i >= args.num_prefixes:
            drain(args.concurrency - 1)
        rid = f"r{i}"
        added_s[rid] = time.perf_counter()
        engine.add_request(rid, prompt, params)
    drain(0)
    elapsed_s = time.perf_counter() - start
    stats = engine.stats()
    return {
        "caching": caching, "elapsed_s": elapsed_s, "prefill_tokens": prefill_tokens,
        "prompt_tokens": sum(len(p) for p in prompts), "ttft_p50_s": statistics.median(ttft_s.values()),
        "output_tokens_per_s": output_tokens / elapsed_s, "prefix_cache_hits": stats.prefix_cache_hits,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--model", default="llama-100m", help="llama-100m (context 1,024), llama-small or tiny; default llama-100m.")
    a("--num-requests", type=int, default=64)
    a("--num-prefixes", type=int, default=8, help="Distinct system prompts.")
    a("--prefix-len", type=int, default=768, help="Tokens of each system prompt.")
    a("--question-len", type=int, default=64, help="Tokens of each request's own question.")
    a("--output-len", type=int, default=32, help="Tokens generated per request (EOS ignored).")
    a("--concurrency", type=int, default=8)
    a("--runs", type=int, default=3, help="Runs per setting, interleaved; figures are medians.")
    a("--device", default="cpu")
    a("--seed", type=int, default=0)
    a("--json", type=Path, default=None, help="Write the figures here as JSON.")
    a("--plot", type=Path, default=None, help="Draw the figures here as PNG: off against on, runs and medians.")


def run(args: argparse.Namespace) -> int:
    loaded = build_model(args.model, device=args.device)
    prompts = make_prompts(args, loaded.config.vocab_size)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(args.runs):
        for caching in (True, False):
            r = run_once(loaded, args, prompts, caching)
            runs[caching].append(r)
            print(f"run {i + 1} caching {'on ' if caching else 'off'}: prefill {r['prefill_tokens']} tokens, "
                  f"TTFT p50 {r['ttft_p50_s'] * 1000:.0f} ms, {r['output_tokens_per_s']:.1f} output tokens/s", flush=True)
    med = {c: {k: statistics.median(r[k] for r in rs) for k in ("prefill_tokens", "ttft_p50_s", "output_tokens_per_s")}
           for c, rs in runs.items()}
    ceiling = sum(len(p) for p in prompts) / (args.num_prefixes * args.prefix_len + args.num_requests * args.question_len)
    report = {
        "workload": {k: getattr(args, k) for k in ("model", "num_requests", "num_prefixes", "prefix_len",
                                                   "question_len", "output_len", "concurrency", "runs")},
        "ceiling_prefill_ratio": ceiling,
        "median_on": med[True], "median_off": med[False],
        "prefill_tokens_ratio": med[False]["prefill_tokens"] / max(1, med[True]["prefill_tokens"]),
        "ttft_p50_ratio": med[False]["ttft_p50_s"] / med[True]["ttft_p50_s"],
        "output_tokens_per_s_ratio": med[True]["output_tokens_per_s"] / med[False]["output_tokens_per_s"],
        "runs": runs[True] + runs[False],
    }
    print(f"prefill tokens fell {report['prefill_tokens_ratio']:.2f}x (ceiling {ceiling:.2f}x), TTFT p50 fell "
          f"{report['ttft_p50_ratio']:.2f}x, output tokens/s x{report['output_tokens_per_s_ratio']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        from flotilla_server.bench.prefix_plot import plot_prefix

        plot_prefix(report, args.plot)
    return 0
