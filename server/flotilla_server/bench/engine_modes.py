"""`flotilla-bench modes`: the engine in its own process against the engine on a thread, over HTTP on tiny.

A benchmark, not a test: for each mode it starts real `flotilla-server` processes, interleaving the modes
run by run, and reports the median of the runs, with the servers' CPU-seconds (the HTTP process and its
engine process together) beside wall time. Three scenarios (docs/benchmarks.md, "Engine modes"):

- stream: 64 clients stream at once against 64 slots: output tokens/s, and /healthz p99 meanwhile;
- burst: 200 requests at once against 4 slots (32 queued), 3 times per server: the queue-full 429s' p95
  (429 queue_timeout excluded), and /healthz p99 and maximum meanwhile;
- busy burst: the same, each burst landing while 4 long streams hold the 4 slots (bench/busy_streams.py), so
  that the engine steps while the refusals are written.

With `--http-processes N` (N > 1) a third arm, `process-Nhttp`, serves the process mode through N HTTP
processes (docs/serving.md, "HTTP processes"), interleaved with the others.

Latencies are timed by the kernel (bench/kernel_clock.py), from a burst whose 200 requests are written within
about 2 ms on connections opened beforehand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

from flotilla_server.bench.busy_streams import BusyStreams, wait_idle
from flotilla_server.bench.kernel_clock import UNANSWERED, HealthPoller, burst, post
from flotilla_server.bench.tiny_server import tiny_server

MODES = ("process", "inprocess")
BURST_FLAGS = ("--max-num-seqs", "4", "--queue-depth-per-slot", "8")
# Busy burst: the requests queued behind the busy streams give up after 1 s (429 queue_timeout, not counted),
# well before the streams' 1,500 tokens end (about 6 s on tiny at 4 slots on 2 cores).
BUSY_STREAM_TOKENS = 1500
BUSY_FLAGS = (*BURST_FLAGS, "--queue-timeout-s", "1", "--max-model-len", "2048")


def arms(http_processes: int) -> dict[str, tuple[str, ...]]:
    """Each arm's name and its server flags: the two modes, and the process mode over N HTTP processes."""
    out = {mode: ("--engine-mode", mode) for mode in MODES}
    if http_processes > 1:
        out[f"process-{http_processes}http"] = ("--engine-mode", "process", "--http-processes", str(http_processes))
    return out

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """utime + stime of `pid` and its live children."""
    pids = [pid]
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            pids += [int(c) for c in (task / "children").read_text().split()]
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


async def _stream_chunks(port: int, body: dict) -> int:
    """The SSE data chunks of one streamed POST /v1/completions."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/v1/completions", body))
    chunks = 0
    while line := await reader.readline():
        chunks += line.startswith(b"data: {")
    writer.close()
    return chunks


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_stream(port: int, pid: int, clients: int, max_tokens: int) -> dict:
    """The stream scenario against the server on `port` (`pid`: its HTTP process)."""
    return asyncio.run(_stream(port, pid, clients, max_tokens))


async def _stream(port: int, pid: int, clients: int, max_tokens: int) -> dict:
    body = {"model": "tiny", "prompt": "the sea", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    await _stream_chunks(port, {**body, "max_tokens": 4})  # warm-up
    with HealthPoller(port) as poller:
        cpu0, t0 = _cpu_s(pid), time.perf_counter()
        results = await asyncio.gather(*(_stream_chunks(port, body) for _ in range(clients)))
        wall_s, cpu_s = time.perf_counter() - t0, _cpu_s(pid) - cpu0
    tokens = sum(chunks - 1 for chunks in results)  # the first chunk holds no token
    return {"tokens_per_s": tokens / wall_s, "wall_s": wall_s, "cpu_s": cpu_s,
            "healthz_p99_ms": _pct(poller.latencies_s, 0.99) * 1000, "healthz_unanswered": poller.unanswered}


def measure_burst(port: int, pid: int, requests: int, max_tokens: int, bursts: int, busy_streams: int = 0) -> dict:
    """`bursts` bursts of `requests` at once, each once the last one's admitted requests are done: a server's
    later bursts meet what its first left behind (a heap to collect, caches warm). With `busy_streams`, each
    burst lands while that many streams of BUSY_STREAM_TOKENS run, closed once the burst is answered."""
    request = post("/v1/completions", {"model": "tiny", "prompt": "a crowd", "max_tokens": max_tokens,
                                       "ignore_eos": True, "stream": True})
    busy = post("/v1/completions", {"model": "tiny", "prompt": "the engine's own work",
                                    "max_tokens": BUSY_STREAM_TOKENS, "ignore_eos": True, "stream": True})
    refused: list[float] = []
    unanswered = 0
    with HealthPoller(port) as poller:
        time.sleep(0.3)
        cpu0, t0 = _cpu_s(pid), time.perf_counter()
        for _ in range(bursts):
            if busy_streams:
                with BusyStreams(port, busy_streams, busy) as streams:
                    answers = burst(port, request, requests)
                if streams.ended_early:
                    raise RuntimeError("a busy stream ended before its burst was answered: raise BUSY_STREAM_TOKENS")
                wait_idle(port)
            else:
                answers = burst(port, request, requests)
            refused += [a.latency_s for a in answers if a.status == 429 and a.error_code == "queue_full"]
            unanswered += sum(a.status == UNANSWERED for a in answers)
        wall_s, cpu_s = time.perf_counter() - t0, _cpu_s(pid) - cpu0
    health = poller.latencies_s
    return {"queue_full_429s_per_burst": len(refused) / bursts,
            "p95_429_ms": _pct(refused, 0.95) * 1000 if refused else float("nan"),
            "healthz_p99_ms": _pct(health, 0.99) * 1000, "healthz_max_ms": max(health) * 1000,
            "healthz_unanswered": poller.unanswered, "unanswered_per_burst": unanswered / bursts,
            "wall_s": wall_s, "cpu_s": cpu_s}


def run_modes(runs: int, clients: int, stream_tokens: int, burst_size: int, bursts: int,
              http_processes: int = 1) -> dict[str, dict[str, list[dict]]]:
    flags = arms(http_processes)
    results: dict[str, dict[str, list[dict]]] = {m: {"stream": [], "burst": [], "busy_burst": []} for m in flags}
    for i in range(runs):
        for mode in list(flags) if i % 2 == 0 else reversed(flags):
            with tiny_server(*flags[mode], "--max-num-seqs", "64", "--max-model-len", "512") as server:
                results[mode]["stream"].append(measure_stream(server.port, server.pid, clients, stream_tokens))
            with tiny_server(*flags[mode], *BURST_FLAGS, "--queue-timeout-s", "5", "--max-model-len", "512") as server:
                results[mode]["burst"].append(measure_burst(server.port, server.pid, burst_size, 64, bursts))
            with tiny_server(*flags[mode], *BUSY_FLAGS) as server:
                results[mode]["busy_burst"].append(
                    measure_burst(server.port, server.pid, burst_size, 64, bursts, busy_streams=4))
            print(f"run {i + 1}/{runs} {mode}: " + " ".join(str(rows[-1]) for rows in results[mode].values()),
                  flush=True)
    return results


def medians(results: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict[str, float]]]:
    return {mode: {scenario: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                   for scenario, rows in by.items()} for mode, by in results.items()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=3, help="Runs per mode, interleaved; the median is reported.")
    p.add_argument("--clients", type=int, default=64, help="Concurrent streaming clients (stream scenario).")
    p.add_argument("--stream-tokens", type=int, default=256, help="Tokens each streaming client asks for.")
    p.add_argument("--burst", type=int, default=200, help="Requests sent at once against 4 slots (both burst scenarios).")
    p.add_argument("--bursts", type=int, default=3,
                   help="Bursts per server (both burst scenarios), each after the last one's admitted requests finish.")
    p.add_argument("--http-processes", type=int, default=1,
                   help="Above 1: a third arm, the process mode through this many HTTP processes.")
    p.add_argument("--json", type=Path, help="Write every run and the medians here.")


def run(args: argparse.Namespace) -> int:
    results = run_modes(args.runs, args.clients, args.stream_tokens, args.burst, args.bursts, args.http_processes)
    summary = medians(results)
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "medians": summary}, indent=2) + "\n")
    return 0
