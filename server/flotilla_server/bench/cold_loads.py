"""`flotilla-bench coldload`: what a request that finds its model unloaded waits, from disk against parked.

Issue 37's part 5 bar: the TTFT of such a request for SmolLM2-135M-Instruct (Q4_1 GGUF) in a pool server,
measured over HTTP, is at most 0.3x when the model was parked (evicted with parking on: its engine process kept
its weights, docs/architecture.md, "Parked models") than when it loads from disk after its file was dropped
from the page cache (posix_fadvise DONTNEED).

Two pool servers start once, each with two members, `smol` (the GGUF) and `filler` (tiny), in a budget that
holds one: `disk` parks nothing (--max-parked-models 0: every load reads the source, as before parking), `parked`
parks (--parked-memory 2Gi). A round, in each server (their order alternating round by round): a request to
`filler` evicts `smol`; the GGUF is dropped from the page cache; after a pause (the machine settles, a parked
process collects its garbage) one streamed request to `smol` is timed to its first token, and the server's
load report gives that load's phases. Reported: per arm the median TTFT and load phases over the rounds, the
ratio parked / disk, the CPU (lscpu) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from flotilla_contract.sizes import parse_bytes

from flotilla_server.bench.llama_compare import ISA_ENV
from flotilla_server.bench.llama_compare_report import cpu_info
from flotilla_server.bench.tiny_server import TinyServer, tiny_server

TARGET_RATIO = 0.3
ARMS = ("disk", "parked")
ARM_FLAGS = {"disk": ("--max-parked-models", "0"), "parked": ("--parked-memory", "2Gi")}
KV_CACHE_MEMORY = "32Mi"
PROMPT = "The capital of France is"
DEFAULT_MODEL = Path(os.environ.get("FLOTILLA_CACHE_DIR", Path.home() / ".cache" / "flotilla")) / "models" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                   help="The GGUF to load (`make model` fetches SmolLM2-135M-Instruct Q4_1 there).")
    p.add_argument("--rounds", type=int, default=7, help="Rounds; each times one load per arm.")
    p.add_argument("--pause-s", type=float, default=2.0, help="Seconds between the eviction and the timed request.")
    p.add_argument("--isa", choices=("native", "avx2"), default="native",
                   help="native: as the machine runs; avx2: the servers' AVX2 paths forced (oneDNN, ATen, MKL, "
                        "Flotilla's kernels).")
    p.add_argument("--json", type=Path, help="Write the report here.")
    p.add_argument("--plot", type=Path, help="Write the PNG plot here.")


def drop_page_cache(path: Path) -> None:
    """The file's pages out of the page cache (clean pages: none is written back), so its next read is a disk read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _post_stream(port: int, model: str) -> float:
    """Seconds from sending a streamed completion to its first content chunk; the stream is then read out."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    start_s = time.perf_counter()
    ttft_s = None
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            if ttft_s is None and line.startswith(b"data: {") and b'"text"' in line:
                ttft_s = time.perf_counter() - start_s
    if ttft_s is None:
        raise RuntimeError(f"{model}: the stream ended without a token")
    return ttft_s


def _last_load(port: int, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/flotilla/v1/load", timeout=10) as response:
        models = {m["name"]: m for m in json.load(response)["models"]}
    return models[model]["last_load"]


def _budget_bytes(model: Path) -> int:
    """A budget that holds either member, never both."""
    from flotilla_server.engine.config import EngineConfig
    from flotilla_server.model_cache.engine_processes import EngineProcesses

    engines = EngineProcesses(EngineConfig(kv_cache_memory_bytes=parse_bytes(KV_CACHE_MEMORY), dtype="float32"))
    sizes = [engines.footprint_bytes(str(model)), engines.footprint_bytes("tiny")]
    return max(sizes) + min(sizes) // 2


def measure_round(server: TinyServer, arm: str, model: Path, pause_s: float) -> dict[str, Any]:
    _post_stream(server.port, "filler")  # evicts smol: parked, or stopped
    drop_page_cache(model)
    time.sleep(pause_s)
    ttft_s = _post_stream(server.port, "smol")
    load = _last_load(server.port, "smol")
    if load["origin"] != ("parked" if arm == "parked" else "disk"):
        raise RuntimeError(f"{arm}: smol loaded from {load['origin']}")
    return {"arm": arm, "ttft_s": ttft_s, **{k: load[k] for k in ("seconds", "start_s", "read_s", "build_s", "warmup_s")}}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("ttft_s", "seconds", "start_s", "read_s", "build_s", "warmup_s")
    median = {arm: {k: statistics.median(r[k] for r in rows if r["arm"] == arm) for k in keys} for arm in ARMS}
    ratio = median["parked"]["ttft_s"] / median["disk"]["ttft_s"]
    return {"median": median, "ratio_ttft": ratio, "target_ratio": TARGET_RATIO, "met": ratio <= TARGET_RATIO}


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
    except OSError:
        return None
    return out.stdout.strip() or None


def run(args: argparse.Namespace) -> int:
    if not args.model.is_file():
        print(f"coldload: no {args.model}: run `make model`, or pass --model", flush=True)
        return 2
    if args.isa == "avx2":
        os.environ.update(ISA_ENV)  # the servers inherit it
    load_before = os.getloadavg()
    budget = str(_budget_bytes(args.model))
    flags = ("--model", "filler=tiny", "--memory-budget", budget, "--kv-cache-memory", KV_CACHE_MEMORY,
             "--min-residency-s", "0", "--max-model-len", "512", "--max-num-seqs", "4", "--dtype", "float32")
    rows: list[dict[str, Any]] = []
    with tiny_server(*flags, *ARM_FLAGS["disk"], model=f"smol={args.model}") as disk, \
            tiny_server(*flags, *ARM_FLAGS["parked"], model=f"smol={args.model}") as parked:
        servers = {"disk": disk, "parked": parked}
        for server in servers.values():  # each server's forkserver warm, each member loaded once
            _post_stream(server.port, "smol")
        for r in range(args.rounds):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                row = {"round": r + 1, **measure_round(servers[arm], arm, args.model, args.pause_s)}
                rows.append(row)
                print(f"round {r + 1} {arm}: TTFT {row['ttft_s'] * 1000:.0f} ms (load {row['seconds'] * 1000:.0f} "
                      f"ms: start {row['start_s'] * 1000:.0f}, read {row['read_s'] * 1000:.0f}, build "
                      f"{row['build_s'] * 1000:.0f}, warm-up {row['warmup_s'] * 1000:.0f})", flush=True)
    report = {"benchmark": "coldload", "model": args.model.name, "isa": args.isa, "commit": _commit(),
              "cpu": cpu_info(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "env": {k: os.environ[k] for k in (*ISA_ENV, "OMP_NUM_THREADS") if k in os.environ},
              "flags": list(flags), "arm_flags": {k: list(v) for k, v in ARM_FLAGS.items()}, "pause_s": args.pause_s,
              "rounds": rows, **summarize(rows)}
    m = report["median"]
    print(f"median TTFT: disk {m['disk']['ttft_s'] * 1000:.0f} ms, parked {m['parked']['ttft_s'] * 1000:.0f} ms: "
          f"{report['ratio_ttft']:.2f}x (target <= {TARGET_RATIO}x: {'met' if report['met'] else 'NOT met'})",
          flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        from flotilla_server.bench.cold_loads_plot import plot_cold_loads

        plot_cold_loads(report, args.plot)
    return 0
