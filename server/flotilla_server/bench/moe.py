"""`flotilla-bench moe`: a mixture of experts against a dense model of the same total parameters, on the engine.

Why this comparison: an MoE model holds every expert (its memory is its total parameters) but a token runs only
its top-k, so at one stream, where a decode step reads the weights it uses once, it should be as fast as a much
smaller dense model; at many streams a step's tokens together reach most experts, and the grouped pass
(model/moe.py) must then read them about as a dense layer reads its one wide matrix. The bars (issue 40): at
least 1.5x the dense model's tokens/s at 1 client, at least 0.8x at 16.

The models are random, built in-process: a Qwen3-MoE-shaped decoder (Q/K norms, `--experts` experts of width
`--expert-width`, top `--top-k`, every layer sparse, renormalised top-k weights) and a dense Llama whose MLP width
makes its parameter count the same to within one row of weights (both counts are reported). Both use tiny's
byte-level vocabulary and tied embeddings, so the layers are nearly all of the weights.

Each round runs, per model (their order alternating each round, so a shared machine's drift hits both alike) and
per client count, that many requests at once through one EngineCore in this process (no HTTP): prompts of
`--prompt-tokens` random tokens (fresh each run: no prefix-cache hits), `--max-tokens` generated each, greedy,
EOS ignored; the figure is the output tokens over the run's wall time. Before the rounds each (model, clients)
runs once unmeasured. The torch thread count is fixed (`--threads`, small-step threads off), so both models run
on the same cores. `--isa both` repeats everything in a child process with the AVX2 paths forced
(llama_compare.ISA_ENV: read by oneDNN, ATen and MKL when torch loads, so a process apart).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flotilla_server.bench.llama_compare import ISA_ENV
from flotilla_server.bench.llama_compare_report import cpu_info

MODELS = ("moe", "dense")
CLIENTS = (1, 16)
BARS = {1: 1.5, 16: 0.8}  # the least MoE / dense tokens/s ratio the issue asks at each client count


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--hidden", type=int, default=512, help="Hidden size of both models.")
    a("--layers", type=int, default=8, help="Decoder layers of both models.")
    a("--experts", type=int, default=64, help="Experts per sparse layer.")
    a("--top-k", type=int, default=8, help="Experts each token runs.")
    a("--expert-width", type=int, default=192, help="One expert's intermediate size.")
    a("--prompt-tokens", type=int, default=32)
    a("--max-tokens", type=int, default=64, help="Tokens generated per request.")
    a("--rounds", type=int, default=3, help="Interleaved rounds; the median is reported.")
    a("--threads", type=int, default=1, help="torch CPU threads, the same for both models.")
    a("--dtype", choices=("float32", "bfloat16"), default="float32", help="Both models' weights and activations.")
    a("--isa", choices=("native", "avx2", "both"), default="native",
      help="native: as the machine runs; avx2: the AVX2 paths forced (oneDNN, ATen, MKL, the kernels).")
    a("--json", type=Path, help="Write the runs, medians, ratios, the models and the machine here.")
    a("--plot", type=Path, help="Write a PNG of the medians here.")
    a("--child", action="store_true", help=argparse.SUPPRESS)  # measure one ISA in this process, JSON to --json


def model_configs(args: argparse.Namespace) -> dict[str, Any]:
    """The two ModelConfigs: the MoE one and a dense Llama whose MLP width gives it the same parameter count
    (to within 3 x hidden parameters a layer, one row of gate, up and down)."""
    from flotilla_server.model.config import ModelConfig
    from flotilla_server.model.moe_config import MoeConfig
    from flotilla_server.model.tiny import TINY_CONFIG
    from flotilla_server.model_cache.footprint import parameter_count

    h, layers = args.hidden, args.layers
    shared = {"vocab_size": TINY_CONFIG.vocab_size, "hidden_size": h, "num_layers": layers, "num_heads": 8,
              "num_kv_heads": 2, "head_dim": h // 8, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": True, "bos_token_id": TINY_CONFIG.bos_token_id,
              "eos_token_ids": TINY_CONFIG.eos_token_ids}
    moe = ModelConfig(model_type="qwen3_moe", intermediate_size=args.expert_width, qk_norm=True,
                      moe=MoeConfig(h, args.experts, args.top_k, args.expert_width, norm_topk_prob=True), **shared)
    no_mlp = parameter_count(ModelConfig(model_type="llama", intermediate_size=1, **shared)) - 3 * h * layers
    width = round((parameter_count(moe) - no_mlp) / (3 * h * layers))
    dense = ModelConfig(model_type="llama", intermediate_size=width, **shared)
    return {"moe": moe, "dense": dense}


def build(config: Any, seed: int, dtype: str) -> Any:
    """A LoadedModel of `config` in `dtype` with N(0, 0.02) weights (norms 1) and tiny's tokenizer."""
    import torch

    from flotilla_server.model import DecoderModel, LoadedModel
    from flotilla_server.model.tiny import build_tiny_tokenizer

    model = DecoderModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    model = model.to(getattr(torch, dtype)).eval()
    return LoadedModel(model, build_tiny_tokenizer(), config, config.model_type, "random, for flotilla-bench moe")


def run_once(loaded: Any, clients: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """`clients` requests at once through a fresh engine: output tokens over wall time."""
    from flotilla_server.engine.config import EngineConfig
    from flotilla_server.engine.core import EngineCore
    from flotilla_server.engine.sampling_params import SamplingParams

    blocks = clients * -(-(args.prompt_tokens + args.max_tokens) // 16) + 8
    engine = EngineCore(EngineConfig(model="bench", max_num_seqs=max(CLIENTS), num_kv_blocks=blocks,
                                     small_step_threads=0), loaded=loaded)
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i in range(clients):
        engine.add_request(str(i), [rng.randrange(256) for _ in range(args.prompt_tokens)], params)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    elapsed_s = time.perf_counter() - start
    tokens = clients * args.max_tokens
    return {"clients": clients, "output_tokens": tokens, "elapsed_s": round(elapsed_s, 4), "steps": steps,
            "tokens_per_s": tokens / elapsed_s}


def measure(args: argparse.Namespace, isa: str, log) -> dict[str, Any]:
    """Every round in this process (its ISA fixed when torch loaded)."""
    import torch

    from flotilla_server.model import quant_blocks
    from flotilla_server.model_cache.footprint import parameter_count

    torch.set_num_threads(args.threads)
    configs = model_configs(args)
    models = {name: build(c, seed=i, dtype=args.dtype) for i, (name, c) in enumerate(configs.items())}
    for name, loaded in models.items():
        for clients in CLIENTS:  # warm-up: packed weights made, first-call costs paid
            run_once(loaded, clients, args, seed=-1)
        log(f"{isa}: {name} warm ({parameter_count(configs[name]) / 1e6:.1f} M parameters)")
    runs = []
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for name in MODELS if r % 2 == 0 else MODELS[::-1]:
            for clients in CLIENTS:
                result = run_once(models[name], clients, args, seed=1000 * r + clients)
                runs.append({"isa": isa, "round": r + 1, "model": name, **result})
                log(f"{isa} round {r + 1}: {name} at {clients}: {result['tokens_per_s']:.1f} tok/s")
    moe = configs["moe"].moe
    return {"runs": runs, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "threads": torch.get_num_threads(), "kernel_isa": quant_blocks.active_isa(),
            "models": {name: {"parameters": parameter_count(c), "weight_bytes": models[name].model.weight_bytes(),
                              "intermediate_size": c.intermediate_size} for name, c in configs.items()},
            "active_expert_fraction": moe.num_experts_per_tok / moe.num_experts}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per ISA: median tokens/s by (model, clients), MoE / dense ratios, and whether each bar is met."""
    out = {}
    for isa, r in results.items():
        med = {m: {str(c): statistics.median(x["tokens_per_s"] for x in r["runs"] if x["model"] == m
                                             and x["clients"] == c) for c in CLIENTS} for m in MODELS}
        ratio = {str(c): med["moe"][str(c)] / med["dense"][str(c)] for c in CLIENTS}
        out[isa] = {"median_tokens_per_s": med, "ratio": ratio,
                    "bar_met": {str(c): ratio[str(c)] >= BARS[c] for c in CLIENTS}}
    return out


def _child(args: argparse.Namespace, isa: str, log) -> dict[str, Any]:
    """One ISA's measurements in a fresh interpreter (ISA_ENV must be set before torch loads)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "isa.json"
        argv = [sys.executable, "-m", "flotilla_server.bench.cli", "moe", "--child", "--isa", isa, "--json", str(out)]
        for flag in ("hidden", "layers", "experts", "top_k", "expert_width", "prompt_tokens", "max_tokens", "rounds",
                     "threads", "dtype"):
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        env = {**os.environ, **(ISA_ENV if isa == "avx2" else {})}
        log(f"{isa}: a child process measures ({' '.join(f'{k}={v}' for k, v in ISA_ENV.items()) if isa == 'avx2' else 'as the machine runs'})")
        done = subprocess.run(argv, env=env)
        if done.returncode:
            raise RuntimeError(f"the {isa} child exited with {done.returncode}")
        return json.loads(out.read_text())


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"{time.perf_counter() - started:7.1f}s {msg}", file=sys.stderr, flush=True)

    if args.child:
        args.json.write_text(json.dumps(measure(args, args.isa, log)))
        return 0
    if args.top_k > args.experts or min(args.hidden, args.layers, args.experts, args.top_k, args.expert_width) < 1:
        print("flotilla-bench moe: sizes must be >= 1 and --top-k at most --experts", file=sys.stderr)
        return 2
    isas = ["native", "avx2"] if args.isa == "both" else [args.isa]
    try:
        results = {isa: _child(args, isa, log) for isa in isas}
    except RuntimeError as error:
        print(f"flotilla-bench moe: {error}", file=sys.stderr)
        return 1
    summary = summarize(results)
    for isa, s in summary.items():
        m = s["median_tokens_per_s"]
        print(f"{isa}: " + ", ".join(
            f"{c} client{'s' if c > 1 else ''}: MoE {m['moe'][str(c)]:.1f} vs dense {m['dense'][str(c)]:.1f} tok/s "
            f"({s['ratio'][str(c)]:.2f}x, bar {BARS[c]}x {'met' if s['bar_met'][str(c)] else 'NOT met'})"
            for c in CLIENTS))
    report = {"config": {k: getattr(args, k) for k in ("hidden", "layers", "experts", "top_k", "expert_width",
                                                      "prompt_tokens", "max_tokens", "rounds", "threads", "dtype")},
              "bars": {str(c): b for c, b in BARS.items()}, "cpu": cpu_info(), "summary": summary, "results": results,
              "total_s": round(time.perf_counter() - started, 1)}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        from flotilla_server.bench.moe_plot import plot_moe

        plot_moe(report, args.plot)
    return 0
