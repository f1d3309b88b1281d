"""Structured output over HTTP, checked as a client would: every reply that ends "stop" parses and validates
against its schema (`jsonschema`), and the replies' endings are counted.

`make bench` runs 200 constrained requests (60 streamed) at concurrency 16 with unconstrained ones mixed in
(docs/benchmarks.md, "Structured output"); `make test` runs 40 of them (tests/server/structured).

    python -m flotilla_server.bench.structured_validity --base-url http://127.0.0.1:8000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import jsonschema

from flotilla_server.bench.structured_workload import Planned, plan


@dataclass
class Outcome:
    case: str | None  # None: unconstrained
    stream: bool
    status: int
    finish_reason: str | None
    content: str
    valid: bool | None  # for a constrained reply that ended "stop": parsed and valid; else None
    error: str | None = None


def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[int, str | None, str]:
    parts, finish = [], None
    with client.stream("POST", url, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            return r.status_code, None, r.read().decode()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return 500, None, json.dumps(chunk)
            for choice in chunk["choices"]:
                parts.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
    return 200, finish, "".join(parts)


def run_one(client: httpx.Client, base_url: str, p: Planned) -> Outcome:
    url = f"{base_url}/v1/chat/completions"
    if p.stream:
        status, finish, content = _stream(client, url, p.body)
    else:
        r = client.post(url, json=p.body)
        status = r.status_code
        choice = r.json()["choices"][0] if status == 200 else None
        finish, content = (choice["finish_reason"], choice["message"]["content"]) if choice else (None, r.text)
    name = p.case.name if p.case is not None else None
    out = Outcome(name, p.stream, status, finish, content, None)
    if p.case is not None and status == 200 and finish == "stop":
        try:
            jsonschema.validate(json.loads(content), p.case.schema)
            out.valid = True
        except (ValueError, jsonschema.ValidationError) as e:
            out.valid, out.error = False, str(e)[:300]
    return out


def run(base_url: str, planned: list[Planned], concurrency: int = 16, timeout_s: float = 600.0) -> list[Outcome]:
    with httpx.Client(timeout=timeout_s) as client, ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: run_one(client, base_url, p), planned))


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    constrained = [o for o in outcomes if o.case is not None]
    stopped = [o for o in constrained if o.finish_reason == "stop"]
    return {
        "constrained": len(constrained),
        "streamed": sum(o.stream for o in constrained),
        "unconstrained": len(outcomes) - len(constrained),
        "finish_reasons": dict(Counter(str(o.finish_reason) for o in constrained)),
        "stop_share": len(stopped) / len(constrained) if constrained else 0.0,
        "stopped_valid": sum(bool(o.valid) for o in stopped),
        "stopped_invalid": [asdict(o) for o in stopped if not o.valid],
        "statuses": dict(Counter(o.status for o in outcomes)),
        "by_case": {name: dict(Counter(str(o.finish_reason) for o in constrained if o.case == name))
                    for name in sorted({o.case for o in constrained if o.case})},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="default: the server's first model")
    parser.add_argument("--requests", type=int, default=200, help="constrained requests (default 200)")
    parser.add_argument("--streamed", type=int, default=60, help="of them streamed (default 60)")
    parser.add_argument("--unconstrained", type=int, default=40, help="plain requests mixed in (default 40)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", default=None, help="write the summary and every reply here")
    args = parser.parse_args(argv)
    for name in ("requests", "max_tokens", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.streamed <= args.requests or args.unconstrained < 0:
        parser.error("--streamed must be in 0..--requests and --unconstrained >= 0")
    try:
        model = args.model or httpx.get(f"{args.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    except httpx.HTTPError as e:
        print(f"structured_validity: cannot reach {args.base_url}: {e}", file=sys.stderr)
        return 2
    outcomes = run(args.base_url, plan(args.requests, args.streamed, args.unconstrained, model, args.max_tokens),
                   args.concurrency)
    s = summary(outcomes)
    print(json.dumps({k: v for k, v in s.items() if k != "stopped_invalid"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "replies": [asdict(o) for o in outcomes]}, f, indent=1)
    ok = not s["stopped_invalid"] and s["stop_share"] >= 0.9 and set(s["statuses"]) == {200}
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
