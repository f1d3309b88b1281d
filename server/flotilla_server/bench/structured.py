"""`flotilla-bench structured`: what a JSON schema costs a stream, on SmolLM2-135M-Instruct (49,152 tokens).

- **Throughput**: 16 clients stream 128-token replies, unconstrained (ignore_eos) against under a schema whose
  valid answers are all longer than 128 tokens, so both arms generate the same count (each arm's token count
  is reported). Rounds interleave the arms; the median of each is kept.
- **The mask's share of a step** at batch 1, 16 and 64: from the server's own histograms, the masks' fill
  (on its thread, beside the forward pass) and what the steps waited for it, each over the steps' time.

Then, against the same server, `--tools` sends 100 tool_choice required / named requests through the openai SDK
(bench/tool_validity.py) and `--validity` runs the 200-request check (bench/structured_validity.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from flotilla_server.bench import tool_validity
from flotilla_server.bench.structured_validity import plan, summary
from flotilla_server.bench.structured_validity import run as run_requests
from flotilla_server.bench.tiny_server import tiny_server

DEFAULT_MODEL = Path.home() / ".cache" / "flotilla" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
LONG_SCHEMA = {"type": "array", "minItems": 40, "maxItems": 60, "items": {
    "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "name": {"type": "string", "maxLength": 16}},
    "required": ["id", "name"], "additionalProperties": False}}
PROMPT = "List sixty products of a hardware store as JSON, each with an id and a name."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="a GGUF or model directory (make model fetches "
                        "the default)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--validity", type=int, default=200, help="constrained requests of the validity check "
                        "(60 streamed, 40 unconstrained mixed in); 0 skips it")
    parser.add_argument("--tools", type=int, default=100, help="tool_choice required / named requests through the "
                        "openai SDK, half streamed, each call validated; 0 skips them")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)


def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> int:
    with client.stream("POST", url, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        tokens = 0
        for line in r.iter_lines():
            if line.startswith("data: {") and '"usage":{' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        return tokens


def arm(base: str, model: str, constrained: bool, clients: int, per_client: int, max_tokens: int) -> dict[str, float]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.7,
                            "messages": [{"role": "user", "content": PROMPT}]}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "catalogue", "schema": LONG_SCHEMA}}
    else:
        body["ignore_eos"] = True
    url = f"{base}/v1/chat/completions"
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        tokens = sum(pool.map(lambda _: sum(_stream(client, url, body) for _ in range(per_client)), range(clients)))
        seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def _sums(base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        for name in ("flotilla_grammar_mask_seconds", "flotilla_grammar_mask_wait_seconds",
                     "flotilla_step_duration_seconds"):
            for suffix in ("_sum", "_count"):
                if line.startswith(name + suffix + "{"):
                    out[name + suffix] = out.get(name + suffix, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def mask_share(base: str, model: str, batch: int) -> dict[str, float]:
    before = _sums(base)
    arm(base, model, True, batch, 1, 64)
    after = _sums(base)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = d["flotilla_step_duration_seconds_sum"]
    return {"batch": batch, "steps": d["flotilla_step_duration_seconds_count"],
            "step_ms": 1000 * steps / max(1.0, d["flotilla_step_duration_seconds_count"]),
            "fill_share": d.get("flotilla_grammar_mask_seconds_sum", 0.0) / steps,
            "wait_share": d.get("flotilla_grammar_mask_wait_seconds_sum", 0.0) / steps}


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    with tiny_server("--max-model-len", "2048", model=args.model) as server:
        base = f"http://127.0.0.1:{server.port}"
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        arm(base, model, True, 2, 1, 16)  # warm: the compile, the first steps
        rounds: dict[str, list[dict[str, float]]] = {"unconstrained": [], "json_schema": []}
        for i in range(args.rounds):
            order = ("unconstrained", "json_schema") if i % 2 == 0 else ("json_schema", "unconstrained")
            for name in order:
                rounds[name].append(arm(base, model, name == "json_schema", args.clients, args.requests_per_client,
                                        args.max_tokens))
        medians = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in rounds.items()}
        shares = [mask_share(base, model, b) for b in (1, 16, 64)]
        tools = tool_validity.run(base, model, args.tools) if args.tools else None
        validity = None
        if args.validity:
            outcomes = run_requests(base, plan(args.validity, min(60, args.validity), 40, model, 512))
            validity = summary(outcomes)
    return {"model": args.model, "clients": args.clients, "max_tokens": args.max_tokens, "rounds": rounds,
            "median_tokens_per_s": medians, "ratio": medians["json_schema"] / medians["unconstrained"],
            "mask_share": shares, "validity": validity, "tools": tools}


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    names = list(result["median_tokens_per_s"])
    a.bar(names, [result["median_tokens_per_s"][n] for n in names], color=["#888", "#2a7"])
    a.set_ylabel("output tokens/s (median)")
    a.set_title(f"16 streams x {result['max_tokens']} tokens: {result['ratio']:.2f}x")
    batches = [str(s["batch"]) for s in result["mask_share"]]
    b.bar(batches, [100 * s["fill_share"] for s in result["mask_share"]], label="fill (beside the forward)")
    b.bar(batches, [100 * s["wait_share"] for s in result["mask_share"]], label="waited for", color="#c33")
    b.set_xlabel("batch")
    b.set_ylabel("% of step time")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _refuse(message: str) -> int:
    print(f"flotilla-bench structured: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    for name in ("clients", "requests_per_client", "max_tokens", "rounds"):
        if getattr(args, name) < 1:
            return _refuse(f"--{name.replace('_', '-')} must be >= 1")
    if args.validity < 0 or args.tools < 0:
        return _refuse("--validity and --tools must be >= 0")
    if not Path(args.model).exists():
        return _refuse(f"no model at {args.model}: run `make model`, or pass --model")
    result = run_bench(args)
    printed = {k: v for k, v in result.items() if k not in ("validity", "tools")}
    if result["tools"]:
        printed["tools"] = {k: v for k, v in result["tools"].items() if k != "problems"}
    if result["validity"]:
        printed["validity"] = {k: v for k, v in result["validity"].items() if k != "stopped_invalid"}
    print(json.dumps(printed, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)
    return 0
