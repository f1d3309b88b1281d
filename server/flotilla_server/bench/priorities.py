"""`flotilla-bench priorities`: request classes and tenant caps under load, over HTTP on tiny.

A benchmark, not a test (docs/benchmarks.md, "Priorities and tenants"). Each arm starts its own
`flotilla-server --model tiny --max-num-seqs 16`; the arms of a run are interleaved, run by run, and each
figure is the median of the runs. Everything is measured at the client: TTFT from the request's bytes
being written to the first SSE chunk holding a token; tokens/s over a measurement window of
`--samples` x `--interval-s` seconds (after `--warmup-s` when closed-loop load runs beside).

Loads: open (one request every --interval-s) or closed (N clients back to back, each waiting
--retry-s × (1 ± --retry-jitter) after a refusal). The closed loads run in a process of their own at
`--load-nice` (default 10), so that on a small host the flood's client work yields the cores to the server,
as a client on another machine would; beside them the open ones run in another, so that the probe's latencies never wait on the
flood's event loop. Batch requests carry `X-Flotilla-Class: batch`, tenants `X-Flotilla-Tenant`.
- flood: interactive chat (16 tokens, one every 0.1 s) alone (`idle`), beside --flood closed-loop batch
  clients of 256 tokens (more than slots + queue) unmarked (`fifo`, today's single queue) or marked (`classes`);
- throughput: the marked flood alone (`batch_alone`) against the same beside a light chat, one every
  --light-interval-s (`light`), and beside the flood case's chat (`classes`, for reference);
- share: 32 closed-loop interactive clients beside 32 batch ones, 64 tokens each, with the default
  weights (`share_8_1`) and with `--class-weights interactive=3,batch=1` (`share_3_1`);
- tenants: `--tenant-max-running 8 --tenant-max-queued 8`; tenant B's chat every 0.1 s beside tenant A
  flooding with 64 clients (`tenant_flood`) or sending exactly at its running cap (`tenant_cap`: 8 clients).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import random
import re
import sys
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from flotilla_contract.classes import BATCH, INTERACTIVE

from flotilla_server.bench.cpu_use import cores_used, descendants, snapshot
from flotilla_server.bench.priorities_report import (
    CASES,
    SHARE_WEIGHTS,
    Rec,
    brief,
    case_rows,
    clean,
    format_case,
    medians,
    plot,
    summarise,
)
from flotilla_server.bench.tiny_server import StartFailed, TinyServer, tiny_server

SLOTS = 16
SERVER_FLAGS = ("--max-num-seqs", str(SLOTS), "--max-model-len", "512")
_CODE = re.compile(rb'"code":\s*"([^"]*)"')


@dataclass(frozen=True)
class Load:
    name: str  # interactive, batch, A, B: the figures' prefix
    mode: str  # open: `n` requests, one every --interval-s from the window's start; closed: `n` clients
    n: int
    max_tokens: int
    chat: bool = False  # /v1/chat/completions, else /v1/completions
    cls: str | None = None  # X-Flotilla-Class
    tenant: str | None = None  # X-Flotilla-Tenant
    interval_s: float | None = None  # open: seconds between requests; None: --interval-s

    def payload(self) -> bytes:
        body: dict[str, Any] = {"model": "tiny", "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
        if self.chat:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "Is the harbour open?"}]
        else:
            path, body["prompt"] = "/v1/completions", "The log of the night watch, hour by hour:"
        extra = (f"X-Flotilla-Class: {self.cls}\r\n" if self.cls else "") + (
            f"X-Flotilla-Tenant: {self.tenant}\r\n" if self.tenant else "")
        data = json.dumps(body).encode()
        return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                f"{extra}Content-Length: {len(data)}\r\n\r\n").encode() + data


@dataclass(frozen=True)
class Arm:
    flags: tuple[str, ...]  # beside SERVER_FLAGS
    loads: tuple[Load, ...]


def build_arms(a: argparse.Namespace) -> dict[str, Arm]:
    chat = Load(INTERACTIVE, "open", a.samples, a.chat_tokens, chat=True)
    # the same window as every arm's (samples x --interval-s), one request every --light-interval-s
    light = replace(chat, n=max(1, round(a.samples * a.interval_s / a.light_interval_s)),
                    interval_s=a.light_interval_s)
    flood = Load(BATCH, "closed", a.flood, a.batch_tokens, cls=BATCH)
    share = (Load(INTERACTIVE, "closed", a.share_concurrency, a.closed_tokens),
             Load(BATCH, "closed", a.share_concurrency, a.closed_tokens, cls=BATCH))
    caps = ("--tenant-max-running", str(a.tenant_max_running), "--tenant-max-queued", str(a.tenant_max_queued))
    b = Load("B", "open", a.samples, a.chat_tokens, chat=True, tenant="B")
    tenant_a = Load("A", "closed", a.tenant_flood, a.closed_tokens, tenant="A")

    def weights(arm: str) -> tuple[str, ...]:
        w = SHARE_WEIGHTS[arm]
        return ("--class-weights", ",".join(f"{k}={v:g}" for k, v in w.items()))

    return {
        "idle": Arm((), (chat,)),
        "fifo": Arm((), (chat, replace(flood, cls=None))),
        "classes": Arm((), (chat, flood)),
        "batch_alone": Arm((), (flood,)),
        "light": Arm((), (light, flood)),
        "share_8_1": Arm((), share),  # the defaults: 8:1
        "share_3_1": Arm(weights("share_3_1"), share),
        "tenant_flood": Arm(caps, (b, tenant_a)),
        # at its cap: as many clients as A may run, so it never queues and is never refused
        "tenant_cap": Arm(caps, (b, replace(tenant_a, n=a.tenant_max_running))),
    }


async def _post(port: int, payload: bytes, rec: Rec, t0: float, window: tuple[float, float]) -> None:
    """Sends one request and fills `rec` in as its answer streams; a chunk holding a token is one token."""
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        rec.sent_s = time.perf_counter() - t0
        head = await reader.readuntil(b"\r\n\r\n")
        rec.status = int(head.split(None, 2)[1])
        if rec.status != 200:
            rec.retry_after = b"\nretry-after:" in head.lower()
            found = _CODE.search(await reader.read())
            rec.code = found.group(1).decode() if found else ""
            return
        w0, w1 = window
        while line := await reader.readline():
            if not line.startswith(b"data: {") or b'"role"' in line:  # chat's opening chunk holds no token
                continue
            if line.startswith(b'data: {"error"'):
                rec.code = (found.group(1).decode() if (found := _CODE.search(line)) else "") or "stream_error"
                continue
            now = time.perf_counter() - t0
            if rec.first_token_s is None:
                rec.first_token_s = now
            rec.tokens += 1
            rec.window_tokens += w0 <= now < w1
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        rec.code = rec.code or type(e).__name__
    finally:
        if writer is not None:
            writer.close()


async def _closed(port: int, load: Load, recs: list[Rec], t0: float, window: tuple[float, float],
                  stop: asyncio.Event, retry_s: float, jitter: float) -> None:
    payload, rng = load.payload(), random.Random()
    while not stop.is_set():
        rec = Rec(load.name, time.perf_counter() - t0)
        recs.append(rec)
        await _post(port, payload, rec, t0, window)
        if rec.status != 200 or rec.code:
            await asyncio.sleep(retry_s * (1.0 + jitter * (2.0 * rng.random() - 1.0)))


async def _open(port: int, load: Load, recs: list[Rec], t0: float, window: tuple[float, float],
                interval_s: float) -> None:
    payload, sent = load.payload(), []
    interval_s = load.interval_s or interval_s
    for i in range(load.n):
        delay = window[0] + i * interval_s - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        rec = Rec(load.name, time.perf_counter() - t0)
        recs.append(rec)
        sent.append(asyncio.create_task(_post(port, payload, rec, t0, window)))
    await asyncio.gather(*sent)


async def _class_metrics(port: int) -> dict[str, float]:
    """The server's flotilla_class_* series (no histogram buckets); empty where it has none."""
    with contextlib.suppress(OSError, ValueError):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = (await reader.read()).decode(errors="replace")
        writer.close()
        return {s: float(v) for line in text.splitlines() if line.startswith("flotilla_class_")
                and "_bucket" not in line for s, v in [line.rsplit(" ", 1)]}
    return {}


async def _open_loads(port: int, loads: list[Load], t0: float, window: tuple[float, float], interval_s: float,
                      drain_s: float) -> list[Rec]:
    recs: list[Rec] = []
    tasks = [asyncio.create_task(_open(port, load, recs, t0, window, interval_s)) for load in loads]
    await asyncio.wait(tasks, timeout=max(0.0, window[1] - (time.perf_counter() - t0)) + drain_s)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return recs


def _probe_main(port: int, loads: list[Load], t0: float, window: tuple[float, float], interval_s: float,
                drain_s: float, out: Any) -> None:
    """The open loads in a process of their own: their latencies never wait on the closed loads' event loop
    (perf_counter is CLOCK_MONOTONIC, one clock for every process)."""
    out.put(_loop_run(_open_loads(port, loads, t0, window, interval_s, drain_s)))


async def _closed_loads(port: int, loads: list[Load], t0: float, window: tuple[float, float], retry_s: float,
                        jitter: float, stop: Any) -> list[Rec]:
    recs: list[Rec] = []
    done = asyncio.Event()
    clients = [asyncio.create_task(_closed(port, load, recs, t0, window, done, retry_s, jitter))
               for load in loads for _ in range(load.n)]
    await asyncio.to_thread(stop.wait)
    done.set()
    for task in clients:
        task.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
    return recs


def _flood_main(port: int, loads: list[Load], t0: float, window: tuple[float, float], retry_s: float,
                jitter: float, nice: int, stop: Any, out: Any) -> None:
    """The closed loads in a process of their own, at `nice`: on a host of two cores the flood's own client
    work would otherwise take CPU from the server it measures, which a client on another machine does not."""
    os.nice(nice)
    out.put(_loop_run(_closed_loads(port, loads, t0, window, retry_s, jitter, stop)))


def _results(out: Any, proc: Any) -> list[Rec]:
    """A load process's records, once it sends them; an error naming its exit status if it dies first."""
    while True:
        with contextlib.suppress(queue.Empty):
            return out.get(timeout=1.0)
        if not proc.is_alive():
            raise RuntimeError(f"a load process exited with status {proc.exitcode} before sending its records")


async def _cores_over(window: tuple[float, float], t0: float, groups: dict[str, list[int]]) -> dict[str, float]:
    """The mean cores each group of processes used over the window (cpu_use.py)."""
    await asyncio.sleep(max(0.0, window[0] - (time.perf_counter() - t0)))
    before, start = snapshot(groups), time.perf_counter()
    await asyncio.sleep(max(0.0, window[1] - (time.perf_counter() - t0)))
    return cores_used(before, snapshot(groups), time.perf_counter() - start)


async def drive(server: TinyServer, arm: Arm, a: argparse.Namespace) -> tuple[list[Rec], tuple[float, float], dict,
                                                                               dict]:
    port = server.port
    await _post(port, Load("warm-up", "open", 1, 4, chat=True).payload(), Rec("warm-up", 0.0), 0.0, (0.0, 0.0))
    closed = [load for load in arm.loads if load.mode == "closed"]
    opens = [load for load in arm.loads if load.mode == "open"]
    w0 = a.warmup_s if closed else 0.0
    window = (w0, w0 + a.samples * a.interval_s)
    recs: list[Rec] = []
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    probe = results = flood = flood_out = None
    stop_flood = ctx.Event()
    if opens and closed:  # the probe apart from the pressure (a closed flood keeps one loop busy)
        results = ctx.Queue()
        probe = ctx.Process(target=_probe_main, args=(port, opens, t0, window, a.interval_s, a.drain_s, results))
        probe.start()
    if closed:
        flood_out = ctx.Queue()
        flood = ctx.Process(target=_flood_main,
                            args=(port, closed, t0, window, a.retry_s, a.retry_jitter, a.load_nice, stop_flood,
                                  flood_out))
        flood.start()
    groups = {"server_http": [server.pid], "server_engine": descendants(server.pid),
              "load_closed": [flood.pid] if flood is not None else [],
              "load_open": [probe.pid] if probe is not None else [os.getpid()]}
    cores = asyncio.create_task(_cores_over(window, t0, groups))
    if probe is not None:
        recs += await asyncio.to_thread(_results, results, probe)
        await asyncio.to_thread(probe.join, 30)
    elif opens:
        recs += await _open_loads(port, opens, t0, window, a.interval_s, a.drain_s)
    else:
        await asyncio.sleep(window[1] - (time.perf_counter() - t0))
    if flood is not None:  # the flood runs to the window's end, whenever the open loads finished
        await asyncio.sleep(max(0.0, window[1] - (time.perf_counter() - t0)))
        stop_flood.set()
        recs += await asyncio.to_thread(_results, flood_out, flood)
        await asyncio.to_thread(flood.join, 30)
    return recs, window, await _class_metrics(port), await cores


def _loop_run(coro: Coroutine) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def run_arms(names: list[str], arms: dict[str, Arm], a: argparse.Namespace) -> tuple[dict, dict[str, str]]:
    runs: dict[str, list[dict]] = {n: [] for n in names}
    failed: dict[str, str] = {}
    for i in range(a.runs):
        for name in names if i % 2 == 0 else names[::-1]:
            if name in failed:
                continue
            start = time.perf_counter()
            try:
                with tiny_server(*SERVER_FLAGS, *arms[name].flags) as server:
                    recs, window, metrics, cores = _loop_run(drive(server, arms[name], a))
            except StartFailed as e:
                failed[name] = str(e)
                print(f"arm {name}: {e}", flush=True)
                continue
            summary = summarise(recs, window) | {f"cores_{k}": v for k, v in cores.items()} | {
                "server_metrics": metrics, "wall_s": time.perf_counter() - start}
            runs[name].append(summary)
            print(f"run {i + 1}/{a.runs} {name} ({summary['wall_s']:.0f} s): {brief(summary)}", flush=True)
            if not metrics and any(load.cls or load.tenant for load in arms[name].loads):
                print(f"warning: arm {name}: the server exports no flotilla_class_* series; it may ignore "
                      "X-Flotilla-Class and X-Flotilla-Tenant, so this arm measures FIFO", flush=True)
    return runs, failed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", default=",".join(CASES), help=f"Cases to run, comma-separated: {', '.join(CASES)}.")
    p.add_argument("--arms", help="Run exactly these arms instead (comma-separated), e.g. idle,fifo.")
    p.add_argument("--quick", action="store_true",
                   help="A smoke run: 1 run, 50 samples, 128-token batch requests, 1.5 s warm-up.")
    p.add_argument("--runs", type=int, help="Runs of each arm, interleaved; the median is reported (default 3).")
    p.add_argument("--samples", type=int, help="Open-loop requests per arm; the window is samples x interval "
                                               "(default 200).")
    p.add_argument("--interval-s", type=float, default=0.1, help="Open-loop interarrival time.")
    p.add_argument("--light-interval-s", type=float, default=0.5,
                   help="Interarrival time of the throughput case's light chat (arm light): over the same window, "
                        "so samples x interval-s / this many requests.")
    p.add_argument("--chat-tokens", type=int, default=16, help="Tokens of each interactive chat request.")
    p.add_argument("--flood", type=int, default=150, help="Closed-loop batch clients (flood, throughput).")
    p.add_argument("--batch-tokens", type=int, help="Tokens of each flood request (default 256).")
    p.add_argument("--share-concurrency", type=int, default=32, help="Closed-loop clients of each class (share).")
    p.add_argument("--closed-tokens", type=int, default=64, help="Tokens of each share and tenant A request.")
    p.add_argument("--tenant-max-running", type=int, default=8, help="The server's cap (tenants).")
    p.add_argument("--tenant-max-queued", type=int, default=8, help="The server's cap (tenants).")
    p.add_argument("--tenant-flood", type=int, default=64, help="Tenant A's closed-loop clients when it floods.")
    p.add_argument("--warmup-s", type=float, help="Closed-loop load before the window opens (default 3).")
    p.add_argument("--retry-s", type=float, default=0.2, help="A closed-loop client's pause after a refusal.")
    p.add_argument("--retry-jitter", type=float, default=0.5,
                   help="Spread each pause after a refusal uniformly over --retry-s x (1 ± this), as independent "
                        "clients' retries spread (0: every refused client retries in step, in bursts).")
    p.add_argument("--load-nice", type=int, default=10,
                   help="Niceness of the closed-loop clients' process, so that on a small host the flood's client "
                        "work yields the cores to the server it loads, as a client on another machine would "
                        "(0: they compete as equals). The open-loop probe keeps the bench's own priority.")
    p.add_argument("--drain-s", type=float, default=90.0, help="Longest wait for open-loop requests after the window.")
    p.add_argument("--json", type=Path, help="Write every run, the medians and the cases' rows here.")
    p.add_argument("--plot", type=Path, help="Write a PNG: interactive TTFT CDFs, then bars of the other cases.")


def run(args: argparse.Namespace) -> int:
    quick = args.quick
    args.runs = args.runs or (1 if quick else 3)
    args.samples = args.samples or (50 if quick else 200)
    args.batch_tokens = args.batch_tokens or (128 if quick else 256)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (1.5 if quick else 3.0)
    arms = build_arms(args)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    names = [n.strip() for n in args.arms.split(",")] if args.arms else list(
        dict.fromkeys(arm for c in cases for arm in CASES[c][1]))
    unknown = [c for c in cases if c not in CASES] + [n for n in names if n not in arms]
    if unknown:
        print(f"flotilla-bench priorities: unknown case or arm {', '.join(unknown)}; cases: {', '.join(CASES)}; "
              f"arms: {', '.join(arms)}", file=sys.stderr)
        return 2
    runs, failed = run_arms(names, arms, args)
    med = {n: medians(r) for n, r in runs.items() if r}
    shown = [c for c in CASES if any(arm in names for arm in CASES[c][1])]
    rows = {c: case_rows(c, med, runs, args.samples) for c in shown}
    for c in shown:
        print(format_case(c, rows[c], [arm for arm in CASES[c][1] if not runs.get(arm)]))
    config = {k: v for k, v in vars(args).items() if k not in ("json", "plot", "func")} | {"slots": SLOTS}
    report = clean({"config": config | {"server_flags": list(SERVER_FLAGS)},
                    "arms": {n: {"flags": list(arms[n].flags), "loads": [asdict(x) for x in arms[n].loads]}
                             for n in names},
                    "runs": runs, "medians": med, "cases": rows, "failed": failed})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.plot:
        plot(report, args.plot)
    return 1 if failed else 0
