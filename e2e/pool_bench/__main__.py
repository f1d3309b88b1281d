"""`python -m e2e.pool_bench`: a shared pool against dedicated replicas, on the whole loop, one trace.

Four tiny models, once as cost-first members of one ModelPool of 2 replicas whose budget holds 2 models per
replica, once as 4 dedicated InferenceModels of 1 replica, each behind the gateway, replaying the same
request trace built from an Azure trace that flotilla-sim ships (sim/flotilla_sim/traces;
e2e/pool_bench/trace.py). `make bench` runs it; the figures and how to read them are in docs/benchmarks.md
("Shared pool against dedicated replicas").

It lives beside e2e/ because it drives what the e2e tests drive (emulated API, real operator, pod runner,
real servers, gateway, Prometheus): no package of ours may import all of those (.importlinter).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from flotilla_sim.workload import read_azure

from e2e.harness import ROOT, whole_loop
from e2e.pool_bench.arms import Settings, run_arm
from e2e.pool_bench.report import plot, summarize
from e2e.pool_bench.trace import TraceShape, build, fitting_divisor

MODELS = ("m1", "m2", "m3", "m4")  # by popularity rank
ARMS = ("pool", "dedicated")


def parse(argv: list[str] | None) -> argparse.Namespace:
    shape, settings = TraceShape(), Settings()
    p = argparse.ArgumentParser(prog="python -m e2e.pool_bench", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=Path("bench-results/pool.json"), help="Where the figures go.")
    p.add_argument("--plot", type=Path, default=Path("bench-results/pool.png"), help="Where the plot goes.")
    p.add_argument("--trace", default="conv", choices=("conv", "code"), help="Which Azure 2023 trace.")
    p.add_argument("--start-s", type=float, default=shape.start_s, help="The window's start, trace seconds.")
    p.add_argument("--window-s", type=float, default=shape.window_s, help="The window's length, trace seconds.")
    p.add_argument("--keep-every", type=int, default=shape.keep_every, help="Keep every Nth request of the window.")
    p.add_argument("--compression", type=float, default=shape.compression,
                   help="Divide the trace's time by this (4: 10 trace minutes replay in 2.5).")
    p.add_argument("--arms", default=",".join(ARMS), help="Which arms, in this order (comma-separated).")
    p.add_argument("--engine-mode", default=settings.engine_mode, choices=("process", "inprocess"),
                   help="Every server's --engine-mode (process: a load starts an engine process).")
    p.add_argument("--workdir", type=Path, default=None, help="Logs of every process (default: a temp dir).")
    args = p.parse_args(argv)
    if not set(args.arms.split(",")) <= set(ARMS):
        p.error(f"--arms takes {', '.join(ARMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    shape = TraceShape(start_s=args.start_s, window_s=args.window_s, keep_every=args.keep_every,
                       compression=args.compression)
    trace = read_azure(args.trace)
    requests = build(trace, MODELS, shape)
    divisor = fitting_divisor(trace, shape.context_tokens)
    settings = Settings(engine_mode=args.engine_mode, min_residency_s=60.0 / shape.compression)
    print(f"trace {args.trace}: {len(requests)} requests over {requests[-1].at_s:.0f} s, tokens ÷ {divisor}",
          flush=True)

    from flotilla_server.engine.config import EngineConfig
    from flotilla_server.model_cache.engine_processes import EngineProcesses

    footprint = EngineProcesses(EngineConfig(kv_cache_memory_bytes=settings.kv_cache_bytes),
                                settings.engine_mode).footprint_bytes("tiny")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pool-bench-"))
    runs = []
    (workdir / "loop").mkdir(parents=True, exist_ok=True)
    with whole_loop(workdir / "loop") as loop:
        for arm in args.arms.split(","):
            print(f"{arm}: starting (load average {Path('/proc/loadavg').read_text().split()[0]})", flush=True)
            runs.append(run_arm(loop, arm, requests, MODELS, settings, footprint, workdir / arm))
            print(json.dumps(summarize(runs[-1]), indent=1), flush=True)
    summaries = [summarize(run) for run in runs]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    out = {
        "command": " ".join([Path(sys.executable).name, "-m", "e2e.pool_bench", *(argv or sys.argv[1:])]),
        "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": commit.strip(), "cpus": os.cpu_count(),
        "trace": {"file": f"azure-llm-2023-{args.trace}.csv", **asdict(shape), "token_divisor": divisor,
                  "requests": len(requests), "replay_s": round(requests[-1].at_s, 1)},
        "settings": {**asdict(settings), "footprint_bytes": footprint,
                     "pool_budget_bytes": footprint * (2 * settings.models_per_replica + 1) // 2},
        "arms": summaries,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    plot(runs, summaries, args.plot)
    print(f"wrote {args.json} and {args.plot}; logs in {workdir}")
    return 0 if all(s["failures"] == 0 for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
