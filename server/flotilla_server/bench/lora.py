"""`flotilla-bench lora`: what serving 8 LoRA adapters in one batch costs against the base model alone.

One server (`--max-loras 8 --max-lora-rank 16`) serves a random Llama (`llama-100m`, written as a Hugging Face
directory; bench/lora_files.py) and 8 random adapters of rank 16 on all seven target modules, made here in
peft's layout and read back with the server's own reader (model/lora_adapter.load_adapter) before it starts.
It is warmed up (every adapter loaded into its slot), then each round runs two workloads, their order
alternating round by round: `base`, every request on the base model, and `adapters`, request k on adapter
k mod 8 (round-robin, so every step mixes all 8). A workload is `--requests` streamed `/v1/completions` of
`--output-len` tokens (`ignore_eos`, greedy) from `--clients` clients, each sending its next request when the
last ends; each prompt is a short English sentence behind a number of its own, so no workload reuses another's
prefix-cache blocks. Each response must hold exactly `--output-len` tokens (the usage chunk's count): a request
that fails or falls short is counted unanswered, and the run exits 1. A workload's figure is its output tokens
over its wall time; reported: each workload's median over the rounds and their ratio (adapters / base; the
issue's bar is 0.7x, its goal 0.85x). Where the server exports the adapter cache's counters (/metrics), the
report keeps its loads and evictions since start: 8 and 0 when no slot changed hands after the warm-up.

Memory: the 8 adapters as served (the slots, LoraSlots.nbytes, allocated at start in the compute dtype, plus
every adapter's float32 host copy, LoraAdapter.nbytes(4)) against 8 copies of the model's weights as the server
holds them (model_cache/footprint.dense_weight_bytes: in the dtype, with the packed copies of the CPU matmuls):
what one model per fine-tune would hold instead.

`--small`: `llama-small` and a few short requests, to show that every part runs (the test's mode), not how fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from flotilla_server.bench.llama_compare_report import cpu_info
from flotilla_server.bench.tiny_server import StartFailed, tiny_server

WORKLOADS = ("base", "adapters")
TARGET, GOAL = 0.7, 0.85
ADAPTERS, RANK = 8, 16
PROMPTS = ("Write a short story about a lighthouse keeper.", "Explain how a bicycle stays upright.",
           "Describe a quiet morning in a small fishing town.", "List some reasons people enjoy gardening.")
# per mode: the base model and the defaults of the options left unset
MODES = {"full": {"model": "llama-100m", "max_model_len": 512, "rounds": 3, "requests": 64, "output_len": 64,
                  "clients": 16},
         "small": {"model": "llama-small", "max_model_len": 256, "rounds": 2, "requests": 16, "output_len": 8,
                   "clients": 8}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, help="Interleaved rounds (each runs both workloads); the median is reported "
                   "(default: 3; 2 with --small).")
    p.add_argument("--requests", type=int, help="Requests of each workload in each round (default: 64; 16 with "
                   "--small).")
    p.add_argument("--output-len", type=int, help="Output tokens of each request, EOS ignored (default: 64; 8 with "
                   "--small).")
    p.add_argument("--clients", type=int, help="Concurrent streaming clients (default: 16; 8 with --small).")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="The server's --dtype: weights, KV cache and adapter slots.")
    p.add_argument("--small", action="store_true", help="A quick run on llama-small (2 layers, hidden 64) with few "
                   "short requests: shows that every part runs, not how fast.")
    p.add_argument("--json", type=Path, help="Write every workload run, the medians, the ratio and memory here.")
    p.add_argument("--plot", type=Path, help="Write a PNG of the medians and the memory here.")


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings: the mode's defaults under the options given."""
    mode = MODES["small" if args.small else "full"]
    return {"mode": "small" if args.small else "full", "model": mode["model"], "adapters": ADAPTERS, "rank": RANK,
            "max_loras": ADAPTERS, "dtype": args.dtype, "max_model_len": mode["max_model_len"],
            **{k: mode[k] if getattr(args, k) is None else getattr(args, k)
               for k in ("rounds", "requests", "output_len", "clients")}}


def check(config: dict[str, Any]) -> str | None:
    for name in ("rounds", "requests", "output_len", "clients"):
        if config[name] < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {config[name]}"
    most = config["max_model_len"] - 64  # room for the prompt
    if config["output_len"] > most:
        return f"--output-len must be <= {most} (the server holds {config['max_model_len']} tokens a sequence)"
    return None


# --- the files and their memory ------------------------------------------------------------------------------


def adapter_names() -> list[str]:
    return [f"lora-{i}" for i in range(ADAPTERS)]


def write_files(root: Path, config: dict[str, Any]) -> tuple[Path, dict[str, Path], dict[str, Any]]:
    """The base directory, each adapter's directory by name, and the memory figures (each adapter read back with
    the server's reader first: one it would refuse stops the bench here, naming it)."""
    from flotilla_server.bench.lora_files import write_adapter, write_base
    from flotilla_server.model.lora_adapter import load_adapter

    base_dir = root / config["model"]
    base = write_base(config["model"], base_dir)
    paths = {name: write_adapter(base, root / name, RANK, seed=1 + i, base_name=config["model"])
             for i, name in enumerate(adapter_names())}
    adapters = [load_adapter(name, str(path), base, RANK) for name, path in paths.items()]
    return base_dir, paths, memory(base, adapters, config["dtype"])


def memory(base, adapters: list, dtype: str) -> dict[str, Any]:
    import torch

    from flotilla_server.model.lora_linear import LoraSlots
    from flotilla_server.model_cache.footprint import dense_weight_bytes

    # the slots the server allocates, sized on the meta device (nothing allocated here)
    slots = LoraSlots(base, len(adapters), RANK, getattr(torch, dtype), device="meta").nbytes()
    host = sum(a.nbytes(4) for a in adapters)
    model = dense_weight_bytes(base, dtype, "cpu")
    copies = len(adapters) * model
    return {"adapters": len(adapters), "adapter_slot_bytes": slots, "adapter_host_bytes": host,
            "adapters_bytes": slots + host, "model_weight_bytes": model, "model_copies_bytes": copies,
            "adapters_over_copies": (slots + host) / copies}


# --- the client ----------------------------------------------------------------------------------------------


async def _stream(session, url: str, body: dict) -> int:
    """Output tokens of one streamed completion (the usage chunk's count); -1 on any failure."""
    tokens = -1
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                return -1
            async for raw in resp.content:
                if raw.startswith(b"data: {"):
                    event = json.loads(raw[6:])
                    if "error" in event:
                        return -1
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
    except Exception:  # a dropped connection or a timeout: the request is unanswered, the run goes on
        return -1
    return tokens


def request_model(workload: str, k: int, base_model: str, adapters: list[str]) -> str:
    return base_model if workload == "base" else adapters[k % len(adapters)]


async def _workload(port: int, workload: str, tag: str, base_model: str, adapters: list[str], requests: int,
                    clients: int, output_len: int) -> tuple[list[int], float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    counts: list[int] = [-1] * requests
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        async def client(i: int) -> None:
            for k in range(i, requests, clients):
                body = {"model": request_model(workload, k, base_model, adapters), "max_tokens": output_len,
                        "prompt": f"{tag} {k}: {PROMPTS[k % len(PROMPTS)]}", "ignore_eos": True,
                        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
                counts[k] = await _stream(session, url, body)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(min(clients, requests))))
        return counts, time.perf_counter() - t0


def measure(port: int, workload: str, tag: str, base_model: str, adapters: list[str], requests: int, clients: int,
            output_len: int) -> dict[str, Any]:
    counts, wall_s = asyncio.run(_workload(port, workload, tag, base_model, adapters, requests, clients, output_len))
    tokens = sum(c for c in counts if c > 0)
    return {"workload": workload, "requests": requests, "answered": sum(c == output_len for c in counts),
            "tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s,
            "models": len({request_model(workload, k, base_model, adapters) for k in range(requests)})}


def adapter_cache(port: int) -> dict[str, float] | None:
    """The adapter cache's loads and evictions since start, from the server's /metrics; None where it does not
    export them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for key, name in (("loads", "flotilla_lora_adapter_loads_total"),
                          ("evictions", "flotilla_lora_adapter_evictions_total")):
            if line.startswith((name + " ", name + "{")):
                found[key] = found.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return found if len(found) == 2 else None


def _models(port: int) -> list[dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
        return json.load(r)["data"]


# --- the run -------------------------------------------------------------------------------------------------


def run_bench(config: dict[str, Any], root: Path, log) -> dict[str, Any]:
    t0 = time.perf_counter()
    base_dir, paths, mem = write_files(root, config)
    log(f"wrote {config['model']} and {len(paths)} adapters of rank {RANK} in {time.perf_counter() - t0:.1f} s")
    flags = [arg for name, path in paths.items() for arg in ("--lora", f"{name}={path}")]
    flags += ["--max-loras", str(ADAPTERS), "--max-lora-rank", str(RANK), "--dtype", config["dtype"],
              "--max-num-seqs", str(max(16, config["clients"])), "--max-model-len", str(config["max_model_len"])]
    runs: list[dict[str, Any]] = []
    with tiny_server(*flags, model=str(base_dir)) as server:
        cards = _models(server.port)
        base_model = cards[0]["id"]
        adapters = [c["id"] for c in cards if c.get("parent") == base_model]
        if sorted(adapters) != sorted(paths):
            raise RuntimeError(f"the server lists adapters {adapters}, not {sorted(paths)}")
        adapters = adapter_names()
        for workload in WORKLOADS:  # warm-up: the first steps, every adapter into its slot
            measure(server.port, workload, "warm-up", base_model, adapters, max(ADAPTERS, config["clients"]),
                    config["clients"], 4)
        for r in range(config["rounds"]):
            for workload in WORKLOADS if r % 2 == 0 else WORKLOADS[::-1]:
                row = {"round": r + 1, **measure(server.port, workload, f"Round {r + 1}", base_model, adapters,
                                                 config["requests"], config["clients"], config["output_len"])}
                runs.append(row)
                log(f"round {r + 1}: {workload}: {row['tokens_per_s']:.1f} output tok/s, "
                    f"{row['answered']}/{row['requests']} answered")
        cache = adapter_cache(server.port)  # 8 loads at the warm-up and no eviction: no slot churn measured
    medians = {w: statistics.median(r["tokens_per_s"] for r in runs if r["workload"] == w) for w in WORKLOADS}
    ratio = medians["adapters"] / medians["base"]
    return {"config": {**config, "served_model": base_model, "adapter_names": adapters,
                       "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "server_flags": flags[2 * ADAPTERS:]},
            "cpu": cpu_info(), "runs": runs, "median_tokens_per_s": medians, "ratio": ratio,
            "target": {"ratio": TARGET, "goal": GOAL, "met": ratio >= TARGET, "goal_met": ratio >= GOAL},
            "answered": sum(r["answered"] for r in runs), "requests": sum(r["requests"] for r in runs),
            "adapter_cache": cache, "memory": mem}


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def summary(report: dict[str, Any]) -> str:
    c, m, med = report["config"], report["memory"], report["median_tokens_per_s"]
    lines = [f"{c['model']}, {c['adapters']} adapters of rank {c['rank']} (--max-loras {c['max_loras']}), "
             f"{c['clients']} clients, {c['requests']} requests x {c['output_len']} tokens a workload, "
             f"median of {c['rounds']} rounds, {c['dtype']}",
             "| workload | output tok/s (median) | per round |", "|---|---:|---|"]
    for w in WORKLOADS:
        rounds = ", ".join(f"{r['tokens_per_s']:.1f}" for r in report["runs"] if r["workload"] == w)
        lines.append(f"| {w} | {med[w]:,.1f} | {rounds} |")
    t = report["target"]
    lines.append(f"adapters / base: {report['ratio']:.2f}x (target {t['ratio']}x: {'met' if t['met'] else 'NOT met'}; "
                 f"goal {t['goal']}x: {'met' if t['goal_met'] else 'not met'})")
    lines.append(f"memory: {m['adapters']} adapters {mib(m['adapters_bytes'])} (slots {mib(m['adapter_slot_bytes'])}"
                 f" + host {mib(m['adapter_host_bytes'])}) against {m['adapters']} model copies "
                 f"{mib(m['model_copies_bytes'])} ({m['adapters_over_copies']:.3f}x)")
    cache = report["adapter_cache"]
    if cache is not None:
        lines.append(f"adapter cache: {cache['loads']:.0f} loads, {cache['evictions']:.0f} evictions since start")
    lines.append(f"answered: {report['answered']}/{report['requests']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config = resolve(args)
    if problem := check(config):
        print(f"flotilla-bench lora: {problem}", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="flotilla-bench-lora-") as root:
            report = run_bench(config, Path(root), lambda m: print(m, file=sys.stderr, flush=True))
    except (StartFailed, RuntimeError, ValueError) as error:
        print(f"flotilla-bench lora: {error}", file=sys.stderr)
        return 1
    print(summary(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        from flotilla_server.bench.lora_plot import plot_lora

        plot_lora(report, args.plot)
    if report["answered"] != report["requests"]:
        print(f"flotilla-bench lora: {report['requests'] - report['answered']} requests unanswered", file=sys.stderr)
        return 1
    return 0
