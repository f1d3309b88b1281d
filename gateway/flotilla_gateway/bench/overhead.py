"""What the gateway adds to a stream: `python -m flotilla_gateway.bench.overhead` (docs/gateway.md, "Overhead").

It starts a fake SSE upstream (bench/fake_upstream.py) and one gateway process pinned to one core
(`taskset`), behind a stub Kubernetes API (bench/stub_api.py) that lists one model with one endpoint.
Then, over N concurrent streams, it measures:
- throughput: chunks/s when the upstream writes as fast as it is read, through the gateway and direct;
- latency: at a paced total rate (default 5,000 chunks/s), each chunk's age on arrival (the upstream stamps
  its monotonic send time into the chunk), through the gateway and direct; the gateway adds the difference.
Figures go to stdout and, with --json, to a file. A benchmark, not a test: its figures depend on the machine.
On a shared machine, --nice puts the three processes ahead of the neighbours' work; --profile writes a
CPU-time profile of the gateway; --gateway-python compares another venv's libraries (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from flotilla_gateway.bench.stub_api import StubModel, serve_stub

MODEL = "bench"
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _streams(url: str, num_streams: int, chunks: int) -> tuple[int, float, list[float]]:
    """(chunks received, seconds, each chunk's age on arrival in seconds) over `num_streams` streams."""
    ages: list[float] = []
    received = 0
    body = {"model": MODEL, "prompt": "x", "max_tokens": chunks, "stream": True}

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal received
        async with session.post(url + "/v1/completions", json=body) as response:
            assert response.status == 200, await response.text()
            async for line in response.content:
                if line.startswith(b"data: {"):
                    ages.append((time.monotonic_ns() - json.loads(line[6:])["t_ns"]) / 1e9)
                    received += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(one(session) for _ in range(num_streams)))
        return received, time.perf_counter() - started, ages


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used: a figure the neighbours' noise does not inflate."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@contextlib.contextmanager
def _process(command: list[str], log: Path, env: dict[str, str] | None = None,
             stop: signal.Signals = signal.SIGTERM) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield process
    finally:
        process.send_signal(stop)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout_s} s")
            await asyncio.sleep(0.1)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    upstream_port, gateway_port = _free_port(), _free_port()
    work = Path(tempfile.mkdtemp(prefix="flotilla-gateway-bench-"))
    runner, kubeconfig = await serve_stub([StubModel(MODEL, (("127.0.0.1", upstream_port),))], work)
    pin = ["taskset", "-c", args.gateway_core] if shutil.which("taskset") and args.gateway_core else []
    pin_others = ["taskset", "-c", args.other_cores] if pin and args.other_cores else []
    upstream_cmd = [*pin_others, sys.executable, "-m", "flotilla_gateway.bench.fake_upstream",
                    "--port", str(upstream_port)]
    launch = ["-c", PROFILED_GATEWAY, str(args.profile.resolve())] if args.profile else ["-m", "flotilla_gateway.cli"]
    gateway_cmd = [*pin, args.gateway_python or sys.executable, *launch, "--kubeconfig", str(kubeconfig),
                   "--host", "127.0.0.1", "--port", str(gateway_port), "--log-level", "warning"]
    if pin_others:
        os.sched_setaffinity(0, {int(c) for c in args.other_cores.split(",")})
    if args.nice:  # all three processes (this one, and the two it starts, inherit it) ahead of the neighbours
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    results: dict[str, Any] = {"streams": args.streams, "gateway_core": args.gateway_core or "unpinned",
                               "nice": args.nice, "gateway_python": args.gateway_python or sys.executable}
    direct, gateway = f"http://127.0.0.1:{upstream_port}", f"http://127.0.0.1:{gateway_port}"
    try:
        # SIGINT: uvicorn re-raises the signal once shut down, and only SIGINT (KeyboardInterrupt) lets cProfile write
        with _process(upstream_cmd, work / "upstream.log"), \
                _process(gateway_cmd, work / "gateway.log", stop=signal.SIGINT) as gw:
            await _wait_http(direct + "/readyz")
            await _wait_http(gateway + "/readyz")
            await _streams(gateway, 8, 50)  # warm the connection pools
            for name, url in (("direct", direct), ("gateway", gateway)):
                cpu_before = _cpu_s(gw.pid)
                count, seconds, _ = await _streams(url, args.streams, args.chunks)
                results[f"{name}_max_chunks_per_s"] = round(count / seconds)
                if name == "gateway":
                    results["gateway_cpu_us_per_chunk_max"] = round((_cpu_s(gw.pid) - cpu_before) / count * 1e6, 1)
            interval_s = args.streams / args.paced_rate
            async with aiohttp.ClientSession() as session:
                await session.post(direct + "/fake/config", json={"chunk_interval_s": interval_s})
            for name, url in (("direct", direct), ("gateway", gateway)):
                cpu_before = _cpu_s(gw.pid)
                count, seconds, ages = await _streams(url, args.streams, args.paced_chunks)
                if name == "gateway":
                    cpu_us = (_cpu_s(gw.pid) - cpu_before) / count * 1e6
                    results["gateway_cpu_us_per_chunk_paced"] = round(cpu_us, 1)
                    results["gateway_paced_core_share"] = round(cpu_us * count / seconds / 1e6, 3)
                results[f"{name}_paced_chunks_per_s"] = round(count / seconds)
                results[f"{name}_chunk_age_p50_ms"] = round(_percentile(ages, 0.5) * 1e3, 3)
                results[f"{name}_chunk_age_p99_ms"] = round(_percentile(ages, 0.99) * 1e3, 3)
    finally:
        await runner.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    results["added_p50_ms"] = round(results["gateway_chunk_age_p50_ms"] - results["direct_chunk_age_p50_ms"], 3)
    results["added_p99_ms"] = round(results["gateway_chunk_age_p99_ms"] - results["direct_chunk_age_p99_ms"], 3)
    results["targets_met"] = results["gateway_max_chunks_per_s"] >= 5000 and results["added_p99_ms"] < 5
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flotilla_gateway.bench.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=64, help="Concurrent streams.")
    p.add_argument("--chunks", type=int, default=2000, help="Chunks per stream in the throughput run.")
    p.add_argument("--paced-rate", type=float, default=5000, help="Total chunks/s the upstream sends in the latency run.")
    p.add_argument("--paced-chunks", type=int, default=400, help="Chunks per stream in the latency run.")
    p.add_argument("--gateway-core", default="0", help="CPU the gateway is pinned to (taskset -c); '' to not pin.")
    p.add_argument("--other-cores", default="1", help="CPUs for the upstream and this client, e.g. 1 or 1,2,3.")
    p.add_argument("--nice", type=int, default=0,
                   help="Run the bench, the upstream and the gateway at this nice value (e.g. -15, as root): on a "
                        "shared machine, so that the neighbours' work waits instead of the chunks.")
    p.add_argument("--gateway-python", help="Interpreter for the gateway (another venv, to compare libraries); "
                                            "default: this one.")
    p.add_argument("--json", type=Path, help="Also write the figures to this file.")
    p.add_argument("--profile", type=Path, help="Run the gateway under cProfile (CPU time) and write its stats here "
                                                "(read them with python -m pstats); slows the gateway down.")
    args = p.parse_args(argv)
    results = asyncio.run(run(args))
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
