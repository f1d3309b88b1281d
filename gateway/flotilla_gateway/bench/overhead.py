"""What the gateway costs per chunk: `python -m flotilla_gateway.bench.overhead` (docs/benchmarks.md, "Gateway overhead").

It starts a fake SSE upstream (bench/fake_upstream.py) and the gateway pinned to one core (`taskset`), behind a
stub Kubernetes API (bench/stub_api.py) listing two models on that upstream, one routed by least load and one
by prefix; with --baseline-tree, a second gateway runs another tree's code (the commit before some work) on
the same core. Arms: `direct` (straight to the upstream) and each gateway × each policy, interleaved (each
round runs every arm, in an order rotated round by round). Per arm and round:
- paced: `--streams` streams of `--rate`/streams chunks/s, each on its own schedule (random phases), requests of
  `--request-chunks` chunks back to back: the gateway's CPU seconds per 1,000 chunks (its own user + system
  time, which the neighbours' noise does not inflate) and each chunk's age on arrival (the upstream stamps its
  send time); the gateway adds the difference from `direct` in the same round;
- fast: the upstream writing as fast as read: chunks/s, and CPU per chunk (what one gateway core sustains).
The summary is each figure's median over the rounds. A benchmark, not a test: its figures depend on the
machine. --nice puts the processes ahead of the neighbours' work; --profile writes a CPU-time profile of the
(current) gateway; --gateway-python runs the gateways with another interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from flotilla_gateway.bench.overhead_load import Load, run_streams
from flotilla_gateway.bench.processes import cpu_s, free_port, percentile, process, wait_http
from flotilla_gateway.bench.stub_api import StubModel, serve_stub

MODELS = {"least-load": "bench", "prefix": "bench-prefix"}  # policy → the stub's model routed by it
# The gateway under cProfile, timed in CPU seconds: on a shared machine, wall-clock profiles mostly measure waits
PROFILED_GATEWAY = """
import cProfile, sys, time
from flotilla_gateway.cli import main
profile = cProfile.Profile(time.process_time)
try:
    profile.runcall(main, sys.argv[2:])
finally:
    profile.dump_stats(sys.argv[1])
"""
WHERE = "import flotilla_contract, flotilla_gateway; print(flotilla_gateway.__file__, flotilla_contract.__file__)"


def machine() -> dict[str, Any]:
    """The CPU the figures were taken on, and how busy the machine was."""
    cpu = {}
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU family", "Model", "CPU(s)"):
                cpu[key.strip()] = value.strip()
    return {"cpu": cpu or platform.processor(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def gateway_env(tree: Path | None) -> dict[str, str]:
    """The environment of a gateway running `tree`'s code (PYTHONPATH comes before the venv's editable install)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "contract"), str(tree / "gateway"), env.get("PYTHONPATH", "")])
    return env


def arm_figures(name: str, load: Load, cpu_used_s: float | None) -> dict[str, Any]:
    figures: dict[str, Any] = {"arm": name, "chunks": load.chunks, "chunks_per_s": round(load.chunks / load.seconds),
                               "age_p50_ms": round(percentile(load.ages_s, 0.5) * 1e3, 3),
                               "age_p99_ms": round(percentile(load.ages_s, 0.99) * 1e3, 3)}
    if cpu_used_s is not None:
        figures["cpu_s_per_1000_chunks"] = round(cpu_used_s / load.chunks * 1000, 5)
        figures["gateway_core_share"] = round(cpu_used_s / load.seconds, 3)
    return figures


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds, per mode and arm; latency added = the arm's minus direct's in the same round."""
    direct = {(r["mode"], r["round"]): r for r in runs if r["arm"] == "direct"}
    medians: dict[str, Any] = {}
    for mode in ("paced", "fast"):
        for arm in dict.fromkeys(r["arm"] for r in runs if r["mode"] == mode):
            mine = [r for r in runs if r["mode"] == mode and r["arm"] == arm]
            m: dict[str, Any] = {"chunks_per_s": statistics.median(r["chunks_per_s"] for r in mine)}
            if arm != "direct":
                cpu = statistics.median(r["cpu_s_per_1000_chunks"] for r in mine)
                m["cpu_s_per_1000_chunks"] = round(cpu, 5)
                m["chunks_per_gateway_core_s"] = round(1000 / cpu)  # chunks/s when the gateway had its core to itself
            if mode == "paced":
                m["age_p50_ms"] = statistics.median(r["age_p50_ms"] for r in mine)
                m["age_p99_ms"] = statistics.median(r["age_p99_ms"] for r in mine)
                if arm != "direct":
                    for q in ("p50", "p99"):
                        added = [r[f"age_{q}_ms"] - direct[mode, r["round"]][f"age_{q}_ms"] for r in mine]
                        m[f"added_{q}_ms"] = round(statistics.median(added), 3)
            medians[f"{mode}/{arm}"] = m
    ratios = {}
    for mode in ("paced", "fast"):
        for policy in MODELS:
            now, before = medians.get(f"{mode}/current {policy}"), medians.get(f"{mode}/baseline {policy}")
            if now and before:
                ratios[f"{mode}/{policy}"] = round(now["cpu_s_per_1000_chunks"] / before["cpu_s_per_1000_chunks"], 3)
    return {"medians": medians, "cpu_current_over_baseline": ratios}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    upstream_port = free_port()
    work = Path(tempfile.mkdtemp(prefix="flotilla-gateway-bench-"))
    fleet = [StubModel(model, (("127.0.0.1", upstream_port),), policy) for policy, model in MODELS.items()]
    runner, kubeconfig = await serve_stub(fleet, work)
    pin = ["taskset", "-c", args.gateway_core] if shutil.which("taskset") and args.gateway_core else []
    pin_others = ["taskset", "-c", args.other_cores] if pin and args.other_cores else []
    python = args.gateway_python or sys.executable
    trees = {"current": None, **({"baseline": args.baseline_tree.resolve()} if args.baseline_tree else {})}
    if pin_others:
        os.sched_setaffinity(0, {int(c) for c in args.other_cores.split(",")})
    if args.nice:  # this process and the ones it starts (they inherit it) ahead of the neighbours
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    results: dict[str, Any] = {"machine_before": machine(), "streams": args.streams, "rate": args.rate,
                               "request_chunks": args.request_chunks, "paced_requests": args.paced_requests,
                               "fast_chunks": args.fast_chunks, "rounds": args.rounds, "nice": args.nice,
                               "gateway_core": args.gateway_core or "unpinned", "gateway_python": python, "code": {}}
    direct = f"http://127.0.0.1:{upstream_port}"
    urls: dict[str, str] = {}
    runs: list[dict[str, Any]] = []
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(process([*pin_others, sys.executable, "-m", "flotilla_gateway.bench.fake_upstream",
                                         "--port", str(upstream_port)], work / "upstream.log"))
            pids = {}
            for label, tree in trees.items():
                env, port = gateway_env(tree), free_port()
                where = subprocess.run([python, "-c", WHERE], env=env, capture_output=True, text=True, check=True)
                results["code"][label] = {"tree": str(tree or Path.cwd()), "imports": where.stdout.split()}
                profiled = args.profile and label == "current"
                launch = ["-c", PROFILED_GATEWAY, str(args.profile.resolve())] if profiled else ["-m", "flotilla_gateway.cli"]
                # SIGINT: uvicorn re-raises it once shut down, and only SIGINT (KeyboardInterrupt) lets cProfile write
                gw = stack.enter_context(process(
                    [*pin, python, *launch, "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", str(port),
                     "--log-level", "warning"], work / f"gateway-{label}.log", env, stop=signal.SIGINT))
                pids[label], urls[label] = gw.pid, f"http://127.0.0.1:{port}"
            await wait_http(direct + "/readyz")
            for url in urls.values():
                await wait_http(url + "/readyz")
                for model in MODELS.values():
                    await run_streams(url, model, 8, 1, 50)  # warm the connection pools
            arms = [("direct", direct, MODELS["least-load"], None)]
            arms += [(f"{label} {policy}", urls[label], model, pids[label]) for label in trees
                     for policy, model in MODELS.items()]
            interval_s = args.streams / args.rate
            for round_ in range(args.rounds):
                order = arms[round_ % len(arms):] + arms[:round_ % len(arms)]
                for mode, chunk_interval_s in (("paced", interval_s), ("fast", 0.0)):
                    async with aiohttp.ClientSession() as session:
                        await session.post(direct + "/fake/config", json={"chunk_interval_s": chunk_interval_s})
                    for name, url, model, pid in order:
                        before = cpu_s(pid) if pid else 0.0
                        if mode == "paced":
                            load = await run_streams(url, model, args.streams, args.paced_requests, args.request_chunks,
                                                     interval_s, seed=round_)
                        else:
                            load = await run_streams(url, model, args.streams, 1, args.fast_chunks)
                        figures = arm_figures(name, load, cpu_s(pid) - before if pid else None)
                        runs.append({"mode": mode, "round": round_, **figures})
                        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        await runner.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    results["machine_after"] = machine()
    results.update(summarize(runs))
    results["runs"] = runs
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flotilla_gateway.bench.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=16, help="Concurrent streams.")
    p.add_argument("--rate", type=float, default=1000, help="Total chunks/s of the paced runs, over all streams.")
    p.add_argument("--request-chunks", type=int, default=100, help="Chunks per request in the paced runs.")
    p.add_argument("--paced-requests", type=int, default=4, help="Requests per stream in a paced run, back to back.")
    p.add_argument("--fast-chunks", type=int, default=1000, help="Chunks per stream (one request) in a fast run.")
    p.add_argument("--rounds", type=int, default=5, help="Rounds; each runs every arm, paced then fast.")
    p.add_argument("--baseline-tree", type=Path, metavar="PATH",
                   help="Also run a gateway from this checkout (its contract/ and gateway/ come first on "
                        "PYTHONPATH), e.g. a `git worktree` of the commit before the work being measured.")
    p.add_argument("--gateway-core", default="0", help="CPU the gateways are pinned to (taskset -c); '' to not pin.")
    p.add_argument("--other-cores", default="1", help="CPUs for the upstream and this client, e.g. 1 or 1,2,3.")
    p.add_argument("--nice", type=int, default=0,
                   help="Run the bench, the upstream and the gateways at this nice value (e.g. -15, as root): on a "
                        "shared machine, so that the neighbours' work waits instead of the chunks.")
    p.add_argument("--gateway-python", help="Interpreter for the gateways (another venv, to compare libraries); "
                                            "default: this one.")
    p.add_argument("--json", type=Path, help="Also write the figures to this file.")
    p.add_argument("--plot", type=Path, help="Also draw the figures into this PNG.")
    p.add_argument("--profile", type=Path, help="Run the current gateway under cProfile (CPU time) and write its "
                                                "stats here (read them with python -m pstats); slows it down.")
    args = p.parse_args(argv)
    results = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot:
        from flotilla_gateway.bench.overhead_plot import plot

        plot(results, args.plot)


if __name__ == "__main__":
    main()
