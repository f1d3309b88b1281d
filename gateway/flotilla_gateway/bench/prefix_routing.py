"""Prefix routing against round-robin, on real servers: `python -m flotilla_gateway.bench.prefix_routing`.

The question (docs/benchmarks.md, "Prefix routing through the gateway"): when tenants' system prompts do
not all fit in every replica's KV cache, does the gateway's `prefix` policy (CHWBL) keep each prompt warm
on one replica, where round-robin makes every replica recompute them?

Set-up: `--replicas` real `flotilla-server --model tiny` processes with prefix caching, each with
`--num-kv-blocks` sized for about two system prompts (plus the running requests' own blocks), behind the
real gateway process (its watcher reads a fixed fleet from bench/stub_api.py; routing is the gateway's).
Workload: `--tenants` system prompts of `--system-tokens` tokens (characters that tiny's byte-level
tokenizer keeps one token each), each request a random tenant's prompt plus a unique question, streamed,
`--concurrency` clients at once. Arms, interleaved run by run with fresh prompts each time (so no run
finds another's blocks cached):
- `prefix`: through the gateway, the model's `spec.routing.policy: prefix`;
- `round-robin`: straight to the replicas in turn, as a Kubernetes Service in IPVS round-robin mode does
  (the gateway has no round-robin policy; the bench reimplements none of the gateway's routing).
Figures per run: the servers' own prefix hit rate (hit ÷ queried prompt tokens, from /metrics), client
TTFT (to the first streamed token), and in-flight per replica (running + waiting, sampled from each
server's load report) as max ÷ mean of the replicas' time averages. The summary is the median per arm.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from flotilla_contract.flags import DEFAULT_BLOCK_SIZE
from flotilla_contract.labels import TENANT_HEADER
from flotilla_contract.load import LOAD_PATH, ServerLoad
from flotilla_contract.metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES
from prometheus_client.parser import text_string_to_metric_families

from flotilla_gateway.bench.prefix_routing_plot import plot
from flotilla_gateway.bench.processes import free_port, percentile, process, wait_http
from flotilla_gateway.bench.stub_api import StubModel, serve_stub
from flotilla_gateway.bench.tenant_placement import placements

MODEL = "tiny"
ARMS = ("prefix", "round-robin")
ALPHABET = string.ascii_uppercase + string.digits + " "  # no BPE merges in tiny's tokenizer: one token a character
TEMPLATE_TOKENS = 24  # tiny's chat template around a system and a user message, rounded up
SAMPLE_INTERVAL_S = 0.1


@dataclass(frozen=True)
class Request:
    tenant: int
    system: str
    question: str


def workload(args: argparse.Namespace, seed: int) -> list[Request]:
    rng = random.Random(seed)
    prompts = ["".join(rng.choice(ALPHABET) for _ in range(args.system_tokens)) for _ in range(args.tenants)]
    requests = []
    for i in range(args.requests):
        tenant = rng.randrange(args.tenants)
        question = f"Q{i} " + "".join(rng.choice(ALPHABET) for _ in range(args.question_tokens))
        requests.append(Request(tenant, prompts[tenant], question))
    return requests


def default_kv_blocks(args: argparse.Namespace) -> int:
    """About two system prompts' blocks, plus the own blocks (question, template, output) of a full batch."""
    prompt_blocks = -(-args.system_tokens // DEFAULT_BLOCK_SIZE)
    own_blocks = -(-(args.question_tokens + TEMPLATE_TOKENS + args.output_tokens) // DEFAULT_BLOCK_SIZE) + 1
    return 2 * prompt_blocks + args.slots * own_blocks


def server_executable() -> str:
    beside = Path(sys.executable).parent / "flotilla-server"
    return str(beside) if beside.exists() else (shutil.which("flotilla-server") or "flotilla-server")


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    wanted = {PREFIX_CACHE_HITS: "hits", PREFIX_CACHE_QUERIES: "queries", "flotilla_requests": "requests"}
    out = {"hits": 0.0, "queries": 0.0, "requests": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in wanted:
            for sample in family.samples:
                if sample.name.endswith("_total") and (family.name != "flotilla_requests"
                                                       or sample.labels.get("code") == "200"):
                    out[wanted[family.name]] += sample.value
    return out


async def _sample_in_flight(session: aiohttp.ClientSession, servers: list[str], samples: list[list[int]],
                            stop: asyncio.Event) -> None:
    while not stop.is_set():
        row = []
        for url in servers:
            try:
                async with session.get(url + LOAD_PATH) as response:
                    load = ServerLoad.model_validate_json(await response.read())
                row.append(load.running + load.waiting)
            except (aiohttp.ClientError, ValueError):
                row.append(0)
        samples.append(row)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_INTERVAL_S)


def request_body(request: Request, endpoint: str) -> tuple[str, dict[str, Any]]:
    """(path, body) without the sampling fields."""
    if endpoint == "chat":
        return "/v1/chat/completions", {"model": MODEL, "messages": [
            {"role": "system", "content": request.system}, {"role": "user", "content": request.question}]}
    return "/v1/completions", {"model": MODEL, "prompt": request.system + "\n" + request.question}


async def _one(session: aiohttp.ClientSession, url: str, request: Request, args: argparse.Namespace) -> dict[str, Any]:
    path, body = request_body(request, args.endpoint)
    body |= {"max_tokens": args.output_tokens, "ignore_eos": True, "stream": True, "temperature": 0.0}
    started = time.perf_counter()
    ttft_s = None
    async with session.post(url + path, json=body, headers={TENANT_HEADER: f"t{request.tenant}"}) as response:
        status = response.status
        async for line in response.content:
            if ttft_s is None and line.startswith(b"data: {"):
                choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                if (choice.get("delta") or {}).get("content") or choice.get("text"):
                    ttft_s = time.perf_counter() - started
    return {"status": status, "ttft_s": ttft_s, "e2e_s": time.perf_counter() - started, "tenant": request.tenant}


async def run_arm(arm: str, requests: list[Request], servers: list[str], gateway: str,
                  args: argparse.Namespace, gateway_log: Path | None = None) -> dict[str, Any]:
    log_offset = gateway_log.stat().st_size if gateway_log is not None else 0
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        before = [await _metrics(session, s) for s in servers]
        queue = list(enumerate(requests))
        results: list[dict[str, Any]] = []

        async def client() -> None:
            while queue:
                i, request = queue.pop(0)
                url = gateway if arm == "prefix" else servers[i % len(servers)]
                results.append(await _one(session, url, request, args))

        samples: list[list[int]] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_in_flight(session, servers, samples, stop))
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        elapsed_s = time.perf_counter() - started
        stop.set()
        await sampler
        after = [await _metrics(session, s) for s in servers]
    hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before, strict=True))
    queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))
    per_pod_requests = [round(a["requests"] - b["requests"]) for a, b in zip(after, before, strict=True)]
    busy = [row for row in samples if sum(row) > 0]
    pod_means = [statistics.fmean(col) for col in zip(*busy, strict=True)] if busy else [0.0] * len(servers)
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {
        "arm": arm, "elapsed_s": round(elapsed_s, 2), "statuses": statuses,
        "prefix_hit_rate": round(hits / queries, 4) if queries else None,
        "prompt_tokens_per_request": round(queries / len(requests), 1),
        "ttft_p50_ms": round(percentile(ttfts, 0.5) * 1e3, 1), "ttft_p95_ms": round(percentile(ttfts, 0.95) * 1e3, 1),
        "e2e_p50_ms": round(percentile([r["e2e_s"] for r in results], 0.5) * 1e3, 1),
        "requests_per_pod": per_pod_requests,
        "in_flight_mean_per_pod": [round(m, 2) for m in pod_means],
        "in_flight_max_over_mean": round(max(pod_means) / statistics.fmean(pod_means), 3) if any(pod_means) else None,
        "in_flight_samples": len(busy),
        **(placements(gateway_log, log_offset, servers) if arm == "prefix" and gateway_log is not None else {}),
        "ttfts_ms": [round(t * 1e3, 1) for t in ttfts],
    }


@contextlib.contextmanager
def _servers(args: argparse.Namespace, work: Path) -> Iterator[list[tuple[str, int]]]:
    ports = [free_port() for _ in range(args.replicas)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [server_executable(), "--model", MODEL, "--host", "127.0.0.1", "--max-num-seqs", str(args.slots),
               "--num-kv-blocks", str(args.num_kv_blocks), "--max-model-len", str(args.max_model_len),
               "--prefix-caching", "on", "--log-level", "warning"]
    with contextlib.ExitStack() as stack:
        for i, port in enumerate(ports):
            stack.enter_context(process([*command, "--port", str(port)], work / f"server-{i}.log", env))
        yield [("127.0.0.1", port) for port in ports]


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return round(statistics.median(values), 4) if values else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="flotilla-prefix-bench-"))
    gateway_port = free_port()
    runs: list[dict[str, Any]] = []
    try:
        with _servers(args, work) as pods:
            servers = [f"http://{h}:{p}" for h, p in pods]
            runner, kubeconfig = await serve_stub([StubModel(MODEL, tuple(pods), policy="prefix")], work)
            gateway_cmd = [sys.executable, "-m", "flotilla_gateway.cli", "--kubeconfig", str(kubeconfig),
                           "--host", "127.0.0.1", "--port", str(gateway_port), "--log-level", "info"]  # the access log: each request's replica
            gateway = f"http://127.0.0.1:{gateway_port}"
            try:
                with process(gateway_cmd, work / "gateway.log"):
                    for url in servers:
                        await wait_http(url + "/readyz", args.start_timeout_s)
                    await wait_http(gateway + "/readyz", args.start_timeout_s)
                    await asyncio.sleep(1.0)  # the gateway's first load reports
                    warm = workload(argparse.Namespace(**{**vars(args), "requests": 2 * len(servers)}), -1)
                    await run_arm("round-robin", warm, servers, gateway, args)  # first-request costs, off the record
                    for run_index in range(args.runs):
                        for arm_index, arm in enumerate(args.arms):
                            seed = args.seed + run_index * len(args.arms) + arm_index
                            result = await run_arm(arm, workload(args, seed), servers, gateway, args, work / "gateway.log")
                            result["run"] = run_index
                            runs.append(result)
                            print(json.dumps({k: v for k, v in result.items() if k != "ttfts_ms"}), flush=True)
            finally:
                await runner.cleanup()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summarize(args, runs)


def summarize(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {arm: {key: _median([r for r in runs if r["arm"] == arm], key)
                     for key in ("prefix_hit_rate", "ttft_p50_ms", "ttft_p95_ms", "e2e_p50_ms", "elapsed_s",
                                 "in_flight_max_over_mean")}
               for arm in args.arms}
    out: dict[str, Any] = {
        "workload": {k: getattr(args, k) for k in ("replicas", "tenants", "system_tokens", "question_tokens",
                                                   "output_tokens", "requests", "concurrency", "slots",
                                                   "num_kv_blocks", "max_model_len", "endpoint", "runs", "seed")},
        "medians": medians,
    }
    if "prefix" in medians and "round-robin" in medians:
        p, rr = medians["prefix"], medians["round-robin"]
        ratio = rr["ttft_p50_ms"] / p["ttft_p50_ms"] if p["ttft_p50_ms"] else None
        out["ttft_p50_ratio_round_robin_over_prefix"] = round(ratio, 3) if ratio else None
        out["targets"] = {
            "prefix_hit_rate_at_least_0.8": (p["prefix_hit_rate"] or 0) >= 0.8,
            "ttft_p50_at_least_2x_lower": (ratio or 0) >= 2.0,
            "in_flight_max_over_mean_at_most_1.5": (p["in_flight_max_over_mean"] or 99) <= 1.5,
        }
    out["runs"] = runs
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flotilla_gateway.bench.prefix_routing",
                                description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--tenants", type=int, default=6, help="Distinct system prompts.")
    p.add_argument("--system-tokens", type=int, default=1024, help="Tokens in each system prompt.")
    p.add_argument("--question-tokens", type=int, default=32, help="Tokens in each request's unique question.")
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--requests", type=int, default=180, help="Requests per run.")
    p.add_argument("--concurrency", type=int, default=12, help="Clients at once.")
    p.add_argument("--slots", type=int, default=4, help="Each server's --max-num-seqs.")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="Each server's KV pool; default: two system prompts' blocks plus a full batch's own blocks.")
    p.add_argument("--max-model-len", type=int, default=None, help="Default: the longest request, rounded up to 256.")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--runs", type=int, default=3, help="Runs per arm, interleaved; the summary is the median.")
    p.add_argument("--arms", type=lambda s: tuple(s.split(",")), default=ARMS, help="Comma-separated: prefix,round-robin.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout-s", type=float, default=180.0)
    p.add_argument("--json", type=Path, help="Write the summary and every run here.")
    p.add_argument("--plot", type=Path, help="Write a PNG: TTFT CDFs, hit rate and balance per run.")
    args = p.parse_args(argv)
    if unknown := set(args.arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}: choose from {', '.join(ARMS)}")
    if args.num_kv_blocks is None:
        args.num_kv_blocks = default_kv_blocks(args)
    if args.max_model_len is None:
        longest = args.system_tokens + args.question_tokens + 8 + TEMPLATE_TOKENS + args.output_tokens
        args.max_model_len = -(-longest // 256) * 256
    summary = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(summary, args.plot)


if __name__ == "__main__":
    main()
