"""`flotilla-bench modes`: the engine in its own process against the engine on a thread, over HTTP on tiny.

A benchmark, not a test: for each mode it starts real `flotilla-server` processes, interleaving the modes
run by run, and reports the median of the runs, with the servers' CPU-seconds (the HTTP process and its
engine process together) beside wall time. Two scenarios (docs/benchmarks.md, "Engine modes"):

- stream: 64 clients stream at once against 64 slots: output tokens/s, and /healthz p99 meanwhile;
- burst: 200 requests at once against 4 slots (32 queued), 3 times per server: the queue-full 429s' p95 from
  the request's bytes being written (429 queue_timeout excluded), and /healthz p99 and maximum meanwhile.
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

from flotilla_server.bench.tiny_server import tiny_server

MODES = ("process", "inprocess")
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


async def _request(port: int, body: dict) -> tuple[int, float, int, str]:
    """(status, seconds to the status line, SSE data chunks, error code) of one POST /v1/completions."""
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    sent = time.perf_counter()
    status_line = await reader.readline()
    status_s = time.perf_counter() - sent
    chunks, code = 0, ""
    while line := await reader.readline():
        chunks += line.startswith(b"data: {")
        if line.startswith(b"{") and b'"code"' in line:
            code = json.loads(line)["error"]["code"]
    writer.close()
    return int(status_line.split()[1]), status_s, chunks, code


async def _poll_health(port: int, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.perf_counter()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await reader.read()
        out.append(time.perf_counter() - start)
        writer.close()
        await asyncio.sleep(0.02)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _stream(port: int, pid: int, clients: int, max_tokens: int) -> dict:
    body = {"model": "tiny", "prompt": "the sea", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    await _request(port, {**body, "max_tokens": 4})  # warm-up
    stop, health = asyncio.Event(), []
    poller = asyncio.create_task(_poll_health(port, stop, health))
    cpu0, t0 = _cpu_s(pid), time.perf_counter()
    results = await asyncio.gather(*(_request(port, body) for _ in range(clients)))
    wall_s, cpu_s = time.perf_counter() - t0, _cpu_s(pid) - cpu0
    stop.set()
    await poller
    tokens = sum(chunks - 1 for _, _, chunks, _ in results)  # the first chunk holds no token
    return {"tokens_per_s": tokens / wall_s, "wall_s": wall_s, "cpu_s": cpu_s, "healthz_p99_ms": _pct(health, 0.99) * 1000}


async def _burst(port: int, pid: int, requests: int, max_tokens: int, bursts: int) -> dict:
    """`bursts` bursts of `requests` at once, each once the last one's admitted requests are done: a server's
    later bursts meet what its first left behind (a heap to collect, caches warm)."""
    body = {"model": "tiny", "prompt": "a crowd", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    stop, health = asyncio.Event(), []
    poller = asyncio.create_task(_poll_health(port, stop, health))
    await asyncio.sleep(0.3)
    refused: list[float] = []
    cpu0, t0 = _cpu_s(pid), time.perf_counter()
    for _ in range(bursts):
        results = await asyncio.gather(*(_request(port, body) for _ in range(requests)))
        refused += [s for status, s, _, code in results if status == 429 and code == "queue_full"]
    wall_s, cpu_s = time.perf_counter() - t0, _cpu_s(pid) - cpu0
    stop.set()
    await poller
    return {"queue_full_429s_per_burst": len(refused) / bursts,
            "p95_429_ms": _pct(refused, 0.95) * 1000 if refused else float("nan"),
            "healthz_p99_ms": _pct(health, 0.99) * 1000, "healthz_max_ms": max(health) * 1000,
            "wall_s": wall_s, "cpu_s": cpu_s}


def run_modes(runs: int, clients: int, stream_tokens: int, burst: int, bursts: int) -> dict[str, dict[str, list[dict]]]:
    results: dict[str, dict[str, list[dict]]] = {m: {"stream": [], "burst": []} for m in MODES}
    for i in range(runs):
        for mode in MODES if i % 2 == 0 else reversed(MODES):
            with tiny_server("--engine-mode", mode, "--max-num-seqs", "64", "--max-model-len", "512") as server:
                results[mode]["stream"].append(asyncio.run(_stream(server.port, server.pid, clients, stream_tokens)))
            with tiny_server("--engine-mode", mode, "--max-num-seqs", "4", "--queue-depth-per-slot", "8",
                             "--queue-timeout-s", "5", "--max-model-len", "512") as server:
                results[mode]["burst"].append(asyncio.run(_burst(server.port, server.pid, burst, 64, bursts)))
            print(f"run {i + 1}/{runs} {mode}: {results[mode]['stream'][-1]} {results[mode]['burst'][-1]}",
                  flush=True)
    return results


def medians(results: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict[str, float]]]:
    return {mode: {scenario: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                   for scenario, rows in by.items()} for mode, by in results.items()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=3, help="Runs per mode, interleaved; the median is reported.")
    p.add_argument("--clients", type=int, default=64, help="Concurrent streaming clients (stream scenario).")
    p.add_argument("--stream-tokens", type=int, default=256, help="Tokens each streaming client asks for.")
    p.add_argument("--burst", type=int, default=200, help="Requests sent at once against 4 slots (burst scenario).")
    p.add_argument("--bursts", type=int, default=3,
                   help="Bursts per server (burst scenario), each after the last one's admitted requests finish.")
    p.add_argument("--json", type=Path, help="Write every run and the medians here.")


def run(args: argparse.Namespace) -> int:
    results = run_modes(args.runs, args.clients, args.stream_tokens, args.burst, args.bursts)
    summary = medians(results)
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "medians": summary}, indent=2) + "\n")
    return 0
