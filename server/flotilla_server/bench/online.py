"""`flotilla-bench online`: load an OpenAI-compatible server and report what its users would feel.

Fixed concurrency (N clients, each sending its next request when the last ends) or Poisson arrivals
(--request-rate), mixed prompt and output lengths, an optional share of requests cancelled partway
through. Reports throughput, TTFT/ITL/TPOT/E2E percentiles, goodput under SLOs and counts by status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from flotilla_server.bench.online_stats import RequestRecord, records_as_dicts, summarize

_WORDS = ["the", "sea", "is", "calm", "and", "the", "ships", "sail", "north", "to", "the", "harbour", "where", "old", "captains", "tell", "stories", "of", "storms", "and", "stars", "and", "the", "long", "nights", "spent", "waiting", "for", "wind"]


@dataclass(frozen=True)
class Workload:
    prompt_words: int
    max_tokens: int
    cancel_after_chunks: int | None  # None: read to the end


def make_workloads(args: argparse.Namespace) -> list[Workload]:
    rng = random.Random(args.seed)
    out = []
    for _ in range(args.num_requests):
        max_tokens = rng.randint(args.output_len_min, args.output_len_max)
        cancel = None
        if rng.random() < args.cancel_share:
            cancel = rng.randint(1, max(1, max_tokens - 1))
        out.append(Workload(rng.randint(args.prompt_len_min, args.prompt_len_max), max_tokens, cancel))
    return out


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _body(args: argparse.Namespace, model: str, w: Workload, rng: random.Random) -> dict[str, Any]:
    common = {"model": model, "max_tokens": w.max_tokens, "stream": True, "ignore_eos": True,
              "temperature": args.temperature, "stream_options": {"include_usage": True}}
    text = _prompt(rng, w.prompt_words)
    if args.endpoint == "chat":
        return {**common, "messages": [{"role": "user", "content": text}]}
    return {**common, "prompt": text}


async def _one(client: aiohttp.ClientSession, url: str, body: dict[str, Any], w: Workload,
               t0: float) -> RequestRecord:
    start = time.monotonic()
    rec = RequestRecord(start_s=start - t0, status="connect_error")
    try:
        async with client.post(url, json=body) as resp:
            rec.status = str(resp.status)
            if resp.status != 200:
                rec.retry_after = resp.headers.get("retry-after")
                rec.error = (await resp.read()).decode(errors="replace")[:300]
                return rec
            chunks = 0
            # aiohttp parses HTTP and chunked framing in C: the load generator must cost the box less than
            # the server it measures (both share the CPU here)
            async for raw in resp.content:
                line = raw.decode().rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                now = time.monotonic()
                if '"usage":{' in data or '"error"' in data:  # only the usage chunk (or an error) is parsed whole
                    event = json.loads(data)
                    if "error" in event:
                        rec.status, rec.error = "stream_error", event["error"].get("message")
                        return rec
                    usage = event["usage"]
                    rec.prompt_tokens, rec.output_tokens = usage["prompt_tokens"], usage["completion_tokens"]
                    continue  # include_usage's last chunk has no choices: no token
                if '"role":"assistant"' in data:
                    continue  # a chat stream's opening chunk carries no token
                # every other chunk is one engine event: token timing, even while the text is held back
                # (incomplete UTF-8, a possible stop string)
                if rec.ttft_s is None:
                    rec.ttft_s = now - start
                rec.chunk_times_s.append(now - t0)
                chunks += 1
                if w.cancel_after_chunks is not None and chunks >= w.cancel_after_chunks:
                    rec.status = "cancelled"
                    return rec  # leaving the block closes the connection: the server must cancel
            rec.e2e_s = time.monotonic() - start
    except (aiohttp.ClientError, TimeoutError) as e:
        rec.status, rec.error = ("connect_error" if rec.status == "connect_error" else "stream_error"), repr(e)
    return rec


async def _run(args: argparse.Namespace) -> tuple[list[RequestRecord], float, str]:
    base = args.base_url.rstrip("/")
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a fresh connection per request, as clients do
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=args.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        if args.model:
            model = args.model
        else:
            async with client.get(f"{base}/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
        url = f"{base}/v1/chat/completions" if args.endpoint == "chat" else f"{base}/v1/completions"
        workloads = make_workloads(args)
        rng = random.Random(args.seed + 1)
        bodies = [_body(args, model, w, rng) for w in workloads]
        records: list[RequestRecord] = []
        progress = _progress(args, len(workloads))
        t0 = time.monotonic()

        async def run_one(i: int) -> None:
            records.append(await _one(client, url, bodies[i], workloads[i], t0))
            progress.update(1)

        if args.request_rate:
            arrivals = random.Random(args.seed + 2)
            sem = asyncio.Semaphore(args.concurrency) if args.concurrency else None

            async def gated(i: int) -> None:
                if sem is None:
                    await run_one(i)
                    return
                async with sem:
                    await run_one(i)

            tasks = []
            for i in range(len(workloads)):
                tasks.append(asyncio.create_task(gated(i)))
                await asyncio.sleep(arrivals.expovariate(args.request_rate))
            await asyncio.gather(*tasks)
        else:
            next_index = iter(range(len(workloads)))

            async def worker() -> None:
                for i in next_index:
                    await run_one(i)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        duration_s = time.monotonic() - t0
        progress.close()
    return records, duration_s, model


def _progress(args: argparse.Namespace, total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", disable=args.no_progress, file=sys.stderr)


# --quick: a smoke run in seconds; it changes only the values the command line left at their defaults
QUICK = {"num_requests": 16, "concurrency": 4, "prompt_len_max": 16, "output_len_min": 8, "output_len_max": 32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--quick", action="store_true",
      help="A smoke run in seconds: 16 requests, 4 at a time, prompts of 8-16 words, outputs of 8-32 tokens; "
           "flags given beside it win.")
    a("--base-url", default="http://127.0.0.1:8000", help="Server to load, e.g. http://127.0.0.1:8000.")
    a("--model", default=None, help="Model name to send; default: the first from GET /v1/models.")
    a("--endpoint", choices=("completions", "chat"), default="completions", help="Which API to drive.")
    a("--num-requests", type=int, default=200, help="Requests to send in all.")
    a("--concurrency", type=int, default=8,
      help="Clients sending back to back (fixed concurrency); with --request-rate, a cap on requests in flight.")
    a("--request-rate", type=float, default=None, help="Poisson arrivals at this many requests per second.")
    a("--prompt-len-min", type=int, default=8, help="Shortest prompt, in words.")
    a("--prompt-len-max", type=int, default=64, help="Longest prompt, in words.")
    a("--output-len-min", type=int, default=16, help="Fewest tokens to generate (ignore_eos is set).")
    a("--output-len-max", type=int, default=128, help="Most tokens to generate.")
    a("--cancel-share", type=float, default=0.0, help="Share of requests (0..1) cancelled partway through.")
    a("--temperature", type=float, default=0.0, help="Sampling temperature sent with every request.")
    a("--slo-ttft-ms", type=float, default=None, help="Goodput SLO on time to first token, ms.")
    a("--slo-tpot-ms", type=float, default=None, help="Goodput SLO on time per output token, ms.")
    a("--seed", type=int, default=0, help="Seed of the workload (lengths, words, cancellations, arrivals).")
    a("--timeout-s", type=float, default=600.0, help="Per-request read timeout, seconds.")
    a("--json", type=Path, default=None, help="Write the summary and per-request records here.")
    a("--plot", type=Path, default=None, help="Write a PNG of latency distributions and token throughput here.")
    a("--no-progress", action="store_true", help="No progress bar.")


def _check(args: argparse.Namespace) -> str | None:
    if args.num_requests < 1:
        return "--num-requests must be >= 1"
    if args.concurrency < 1 and not args.request_rate:
        return "--concurrency must be >= 1 (or give --request-rate)"
    if args.request_rate is not None and args.request_rate <= 0:
        return "--request-rate must be > 0"
    if not 0.0 <= args.cancel_share <= 1.0:
        return "--cancel-share must be in [0, 1]"
    if not (1 <= args.prompt_len_min <= args.prompt_len_max):
        return "need 1 <= --prompt-len-min <= --prompt-len-max"
    if not (1 <= args.output_len_min <= args.output_len_max):
        return "need 1 <= --output-len-min <= --output-len-max"
    return None


def _apply_quick(args: argparse.Namespace) -> None:
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    for name, value in QUICK.items():
        if getattr(args, name) == defaults.get_default(name):
            setattr(args, name, value)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        _apply_quick(args)
    problem = _check(args)
    if problem:
        print(f"flotilla-bench online: {problem}", file=sys.stderr)
        return 2
    try:
        records, duration_s, model = asyncio.run(_run(args))
    except (aiohttp.ClientError, OSError) as e:
        print(f"flotilla-bench online: cannot reach {args.base_url} ({e!r}): start flotilla-server first "
              "or pass --base-url", file=sys.stderr)
        return 1
    summary = summarize(records, duration_s, args.slo_ttft_ms, args.slo_tpot_ms)
    summary["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                         if k not in ("func", "command")}
    summary["config"]["model"] = model
    _print(summary)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "requests": records_as_dicts(records)}, indent=2))
    if args.plot:
        from flotilla_server.bench.online_plot import plot_run

        plot_run(records, summary, args.plot)
    return 0


def _print(s: dict[str, Any]) -> None:
    print(f"requests: {s['num_requests']}  completed: {s['completed']}  by status: {s['status_counts']}")
    print(f"duration: {s['duration_s']:.2f} s  request throughput: {s['request_throughput_per_s']:.2f}/s  "
          f"output tokens: {s['output_token_throughput_per_s']:.1f}/s  goodput: {s['goodput_requests_per_s']:.2f}/s")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[key]
        cells = "  ".join(f"{k}={v:.1f}" if v is not None else f"{k}=-" for k, v in d.items())
        print(f"{key:8s} {cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flotilla-bench online", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
