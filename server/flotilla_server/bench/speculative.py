"""`flotilla-bench speculative`: prompt-lookup speculative decoding (`--speculative ngram`) against none.

Two servers on the same GGUF file (SmolLM2-135M-Instruct by default, its default `--quantization`, gguf), one
with `--speculative ngram --speculative-tokens K` and one without, both left running; one client. Rounds are
interleaved (the order of the two servers alternates each round) so that a shared machine's drift hits both
alike, and each figure is the median over the rounds. Tasks (docs/benchmarks.md, "Speculative decoding"):

- edit: a ~500-token public-domain passage (speculative_passage.json), an instruction to copy it with one change,
  then its first words again, through /v1/completions, greedy. The non-speculative output must share at least
  80 % of its first 300 tokens' 8-grams with the passage, else the run stops: it would measure the model;
- free: a story asked for through /v1/chat/completions, greedy: the case where proposals rarely pay, so the
  back-off is what keeps speculation from costing;
- equality: 20 prompts (10 chats, 10 completions), greedy: the two servers' replies must be the same text.

Each request streams (with usage); its tokens/s is its completion tokens over its whole time, prompt included.
Before the rounds each server serves each task once, unmeasured: its prompt is then in its prefix cache and its
step threads chosen (engine/step_threads.py), in both arms alike.
`--isa both` runs everything once as the machine runs and once with the AVX2 paths forced.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from flotilla_server.bench import speculative_workload as w
from flotilla_server.bench.llama_compare import ISA_ENV
from flotilla_server.bench.llama_compare_report import cpu_info
from flotilla_server.bench.tiny_server import tiny_server

ARMS = ("ngram", "off")  # the speculating server, the plain one
MAX_MODEL_LEN = 2048
MODEL = "bench"  # --served-model-name of both servers


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="The GGUF file both servers serve (default: SmolLM2-135M-Instruct "
                   "Q4_1, from the cache `make model` fills).")
    p.add_argument("--k", type=int, default=None, help="--speculative-tokens of the speculating server (default: "
                   "the server's own default).")
    p.add_argument("--rounds", type=int, default=5, help="Interleaved rounds; the median is reported.")
    p.add_argument("--edit-max-tokens", type=int, default=300, help="The copy check reads 300.")
    p.add_argument("--free-max-tokens", type=int, default=256)
    p.add_argument("--equality-max-tokens", type=int, default=64)
    p.add_argument("--isa", choices=("native", "avx2", "both"), default="native",
                   help="native: as the machine runs; avx2: the AVX2 paths forced (oneDNN, ATen, MKL, the kernels).")
    p.add_argument("--json", type=Path, help="Write the runs, medians, ratios and the machine here.")
    p.add_argument("--plot", type=Path, help="Write a PNG of the medians here.")


def _stream(client: httpx.Client, base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request: its text, completion tokens and times."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    text, tokens, first_s = "", 0, None
    start = time.perf_counter()
    with client.stream("POST", f"{base}{path}", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {r.status_code}: {r.read().decode(errors='replace')[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece and first_s is None:
                    first_s = time.perf_counter() - start
                text += piece
    elapsed_s = time.perf_counter() - start
    decode_s = elapsed_s - (first_s or 0.0)
    return {"text": text, "completion_tokens": tokens, "elapsed_s": elapsed_s, "ttft_s": first_s,
            "tokens_per_s": tokens / elapsed_s,
            "decode_tokens_per_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else 0.0}


def _complete(client: httpx.Client, base: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return _stream(client, base, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens})


def _chat(client: httpx.Client, base: str, content: str, max_tokens: int) -> dict[str, Any]:
    return _stream(client, base, "/v1/chat/completions",
                   {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})


def _metrics(client: httpx.Client, base: str) -> dict[str, float]:
    out = {}
    for line in client.get(f"{base}/metrics").text.splitlines():
        if line.startswith("flotilla_spec_decode_") and "_total" in line:  # counters (the gauge's delta says nothing)
            name, value = line.split("{", 1)[0], line.rsplit(" ", 1)[1]
            out[name] = float(value)
    return out


@contextlib.contextmanager
def _env(extra: dict[str, str]) -> Iterator[None]:
    """Environment variables the servers started inside inherit."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_isa(isa: str, args: argparse.Namespace, tokenizer: Any, log) -> dict[str, Any]:
    text = w.passage()["text"]
    spec_flags = ["--speculative", "ngram"] + ([] if args.k is None else ["--speculative-tokens", str(args.k)])
    common = ["--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", MODEL]
    load_before = os.getloadavg()
    with _env(ISA_ENV if isa == "avx2" else {}), contextlib.ExitStack() as stack, httpx.Client() as client:
        bases = {}
        for arm in ARMS:  # one after the other: each measures its threads at start, alone
            server = stack.enter_context(tiny_server(*common, *(spec_flags if arm == "ngram" else []),
                                                     model=str(args.model)))
            bases[arm] = f"http://127.0.0.1:{server.port}"
            log(f"{isa}: {arm} ready on port {server.port}")
        for arm in ARMS:  # warm-up, not measured: each task once (its prompt cached, its step threads chosen)
            _complete(client, bases[arm], w.edit_prompt(text), args.edit_max_tokens)
            _chat(client, bases[arm], w.FREE_PROMPT, args.free_max_tokens)
        plain = _complete(client, bases["off"], w.edit_prompt(text), args.edit_max_tokens)
        shared = w.shared_ngrams(tokenizer.encode(plain["text"]), tokenizer.encode(text))
        log(f"{isa}: the plain edit output shares {shared:.0%} of its first {w.CHECKED_TOKENS} tokens' "
            f"{w.NGRAM}-grams with the passage")
        if shared < w.MIN_SHARED:
            raise RuntimeError(f"the edit output shares only {shared:.0%} of its {w.NGRAM}-grams with the passage "
                               f"(at least {w.MIN_SHARED:.0%} needed): this would measure the model, not the method")
        runs = []
        for r in range(args.rounds):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                for task in ("edit", "free"):
                    before = _metrics(client, bases[arm])
                    if task == "edit":
                        result = _complete(client, bases[arm], w.edit_prompt(text), args.edit_max_tokens)
                    else:
                        result = _chat(client, bases[arm], w.FREE_PROMPT, args.free_max_tokens)
                    after = _metrics(client, bases[arm])
                    runs.append({"isa": isa, "round": r + 1, "arm": arm, "task": task,
                                 **{k: v for k, v in result.items() if k != "text"},
                                 "spec_counters": {k: after.get(k, 0) - before.get(k, 0) for k in after}})
                    log(f"{isa} round {r + 1}: {arm} {task}: {result['completion_tokens']} tokens, "
                        f"{result['tokens_per_s']:.1f} tok/s")
        equality = _equality(client, bases, text, args.equality_max_tokens)
        log(f"{isa}: {equality['identical']} of {equality['prompts']} greedy replies identical")
        counters = _metrics(client, bases["ngram"])
    return {"runs": runs, "equality": equality, "spec_counters": counters, "edit_shared_8grams": shared,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def _equality(client: httpx.Client, bases: dict[str, str], text: str, max_tokens: int) -> dict[str, Any]:
    differing = []
    prompts = [("chat", c) for c in w.EQUALITY_CHATS] + [("completion", p) for p in w.equality_completions(text)]
    for kind, prompt in prompts:
        call = _chat if kind == "chat" else _complete
        replies = {arm: call(client, bases[arm], prompt, max_tokens)["text"] for arm in ARMS}
        if replies["ngram"] != replies["off"]:
            differing.append({"kind": kind, "prompt": prompt[:80], **replies})
    return {"prompts": len(prompts), "identical": len(prompts) - len(differing), "max_tokens": max_tokens,
            "differing": differing}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians by (task, arm) and speculation's ratios, per ISA: tokens/s over whole requests (the headline), and
    after each request's first token (decode only)."""
    out = {}
    for isa, r in result.items():
        def median(key: str, task: str, arm: str, runs: list = r["runs"]) -> float:
            return statistics.median(x[key] for x in runs if x["task"] == task and x["arm"] == arm)

        med = {task: {arm: median("tokens_per_s", task, arm) for arm in ARMS} for task in ("edit", "free")}
        dec = {task: {arm: median("decode_tokens_per_s", task, arm) for arm in ARMS} for task in ("edit", "free")}
        c = r["spec_counters"]
        proposed = c.get("flotilla_spec_decode_proposed_tokens_total", 0)
        accepted = c.get("flotilla_spec_decode_accepted_tokens_total", 0)
        per_task = {task: _acceptance([x for x in r["runs"] if x["task"] == task and x["arm"] == "ngram"])
                    for task in ("edit", "free")}
        out[isa] = {"median_tokens_per_s": med,
                    "ratio": {task: med[task]["ngram"] / med[task]["off"] for task in med},
                    "median_decode_tokens_per_s": dec,
                    "decode_ratio": {task: dec[task]["ngram"] / dec[task]["off"] for task in dec},
                    "acceptance_rate": accepted / proposed if proposed else 0.0,
                    "acceptance_by_task": per_task,
                    "equality": f"{r['equality']['identical']}/{r['equality']['prompts']}"}
    return out


def _acceptance(runs: list[dict[str, Any]]) -> float | None:
    """Accepted over proposed draft tokens of the speculating server's requests in `runs`."""
    rows = [x["spec_counters"] for x in runs]
    proposed = sum(c.get("flotilla_spec_decode_proposed_tokens_total", 0) for c in rows)
    accepted = sum(c.get("flotilla_spec_decode_accepted_tokens_total", 0) for c in rows)
    return accepted / proposed if proposed else None


def run(args: argparse.Namespace) -> int:
    from flotilla_server.model.gguf_file import GGUFModel
    from flotilla_server.model.gguf_tokenizer import tokenizer_from_gguf

    if args.model is None:
        from flotilla_server.bench.workloads import smollm2_path

        args.model = smollm2_path()
    if not args.model.is_file():
        print(f"flotilla-bench speculative: {args.model} is missing; `make model` fetches it once", file=sys.stderr)
        return 2
    tokenizer = tokenizer_from_gguf(GGUFModel(args.model))
    isas = ["native", "avx2"] if args.isa == "both" else [args.isa]
    result = {}
    try:
        for isa in isas:
            result[isa] = run_isa(isa, args, tokenizer, lambda m: print(m, file=sys.stderr, flush=True))
    except RuntimeError as error:
        print(f"flotilla-bench speculative: {error}", file=sys.stderr)
        return 1
    summary = summarize(result)
    for isa, s in summary.items():
        m = s["median_tokens_per_s"]
        print(f"{isa}: edit {m['edit']['ngram']:.1f} vs {m['edit']['off']:.1f} tok/s ({s['ratio']['edit']:.2f}x), "
              f"free {m['free']['ngram']:.1f} vs {m['free']['off']:.1f} tok/s ({s['ratio']['free']:.2f}x), "
              f"acceptance {s['acceptance_rate']:.0%}, greedy identical {s['equality']}")
    source = w.passage()
    report = {"config": {"model": str(args.model), "k": args.k, "rounds": args.rounds, "isas": isas,
                         "edit_max_tokens": args.edit_max_tokens, "free_max_tokens": args.free_max_tokens,
                         "edit_instruction": w.EDIT_INSTRUCTION, "free_prompt": w.FREE_PROMPT,
                         "passage": {k: source[k] for k in ("title", "author", "published", "license")}},
              "cpu": cpu_info(), "summary": summary, "results": result}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        from flotilla_server.bench.speculative_plot import plot_speculative

        plot_speculative(report, args.plot)
    return 0
