"""`flotilla-bench llamacpp`: Flotilla against llama.cpp's own `llama-server` on the same GGUF file.

Per ISA run (`native`: as the machine runs; `avx2`: Flotilla with the AVX2 paths forced, ISA_ENV below, against
llama-server built for AVX2, bench/llama_server_build.py) three servers start once, one after another, on free
ports: Flotilla keeping the file's blocks (`--quantization gguf`), Flotilla on the dequantized float32 weights
(`--quantization none`, unless `--no-with-float32`) and `llama-server --parallel 16`. Each is warmed up, then
each round visits them in a rotating order and, per client count, streams `/v1/completions` of `--max-tokens`
tokens (`ignore_eos`, greedy, a short fixed English prompt) from every client, `--requests-per-client` one
after another; a batch's figure is its output tokens over its wall time. Reported: per (ISA, server, clients)
the median over rounds, and the ratios to llama-server (docs/benchmarks.md, "Against llama.cpp").

Threads: both get the same N CPUs, the first `--threads` of those this process may use (both pinned there when
fewer than all), and N compute threads: llama-server `-t N -tb N` (OpenMP's own wait policy), Flotilla
`OMP_NUM_THREADS=N`. Flotilla's own default leaves a core to HTTP (docs/serving.md, "CPU threads"): on the
2-core machine of docs/benchmarks.md that cost SmolLM2 about a third of its 16-client tokens/s; `--flotilla-threads
default` runs it that way, and the report keeps the line where it measured its engine's count.

Should llama-server die of SIGSEGV starting or warming up (its AMX matmul did on the KVM guest this was written
on), it is started again with `--no-repack`, and the report says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from flotilla_server.bench.llama_compare_report import (
    PEER,
    cpu_info,
    markdown_table,
    median_table,
    ratio_table,
    targets,
)
from flotilla_server.bench.tiny_server import free_port

ISA_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
           "FLOTILLA_KERNEL_ISA": "avx2"}
OMP_DEFAULTS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")  # flotilla-bench's, not llama.cpp's
ARMS = {"flotilla": "gguf", "flotilla-float32": "none", PEER: None}  # name: Flotilla's --quantization
MAX_MODEL_LEN = 512
PROMPTS = ("Write a short story about a lighthouse keeper.", "Explain how a bicycle stays upright.",
           "Describe a quiet morning in a small fishing town.", "List some reasons people enjoy gardening.")
START_TIMEOUT_S = 300


def default_requests_per_client(clients: int) -> int:
    return 4 if clients == 1 else 2


def check_args(args: argparse.Namespace, cpus: int) -> str | None:
    """The first problem with the options, in one line; None when there is none."""
    if not Path(args.model).is_file():
        return f"--model {args.model} is not a file (`make model` fetches SmolLM2's GGUF)"
    for name in ("rounds", "max_tokens", "threads", "requests_per_client"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {value}"
    if any(c < 1 for c in args.clients):
        return f"--clients must be >= 1, got {min(args.clients)}"
    if args.max_tokens > MAX_MODEL_LEN - 64:
        return f"--max-tokens must be <= {MAX_MODEL_LEN - 64} (the servers hold {MAX_MODEL_LEN} tokens a sequence)"
    if args.threads is not None and args.threads > cpus:
        return f"--threads must be <= {cpus}, the CPUs this process may use"
    return None


# --- servers -------------------------------------------------------------------------------------------------


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read()
    except OSError:
        return 0, b""


def _server_command(arm: str, args: argparse.Namespace, port: int, threads: int, binary: Path) -> list[str]:
    slots = str(max(16, *args.clients))
    common = ["--host", "127.0.0.1", "--port", str(port)]
    if arm == PEER:
        return [str(binary), "-m", str(args.model), "--parallel", slots, "-c", str(int(slots) * MAX_MODEL_LEN),
                "-t", str(threads), "-tb", str(threads), "--no-webui", *common]
    # float32 named: `--dtype auto` would run the dequantized arm in bfloat16 where the CPU computes it
    return [sys.executable, "-m", "flotilla_server.cli", "--model", str(args.model), "--quantization", ARMS[arm],
            "--dtype", "float32", "--max-num-seqs", slots, "--max-model-len", str(MAX_MODEL_LEN), "--log-level", "info", *common]


class Crashed(RuntimeError):
    """The server died of SIGSEGV, starting or warming up."""


@dataclass
class Server:
    port: int
    log: Path
    proc: subprocess.Popen


@contextlib.contextmanager
def running(name: str, cmd: list[str], env: dict, cpus: set[int], ready_path: str):
    """The server of `cmd` until the block ends; stopped by its PID with SIGINT (twice: Flotilla drains, then
    exits), then SIGKILL to its process group after 30 s."""
    port = int(cmd[cmd.index("--port") + 1])
    with tempfile.NamedTemporaryFile(prefix="llamacpp-bench-", suffix=".log") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while _get(port, ready_path)[0] != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                    kind = Crashed if proc.returncode == -signal.SIGSEGV else RuntimeError
                    raise kind(f"{name} did not start (exit status {proc.returncode}): {tail[0]}")
                time.sleep(0.3)
            yield Server(port, Path(log.name), proc)
        finally:
            for _ in range(2):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# --- client --------------------------------------------------------------------------------------------------


async def _stream(session, url: str, body: dict) -> int:
    """Output tokens of one streamed completion: the usage chunk's count, else the chunks carrying text."""
    usage, chunks = None, 0
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            if not raw.startswith(b"data: {"):
                continue
            event = json.loads(raw[6:])
            if "error" in event:
                raise RuntimeError(f"{url}: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]["completion_tokens"]
            chunks += any(c.get("text") for c in event.get("choices") or [])
    return usage if usage is not None else chunks


async def _batch(port: int, model: str, clients: int, per_client: int, max_tokens: int) -> tuple[int, float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True), timeout=timeout) as session:
        async def client(i: int) -> int:
            total = 0
            for j in range(per_client):
                body = {"model": model, "prompt": PROMPTS[(i + j) % len(PROMPTS)], "max_tokens": max_tokens,
                        "ignore_eos": True, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
                tokens = await _stream(session, url, body)
                if tokens != max_tokens:
                    raise RuntimeError(f"port {port} returned {tokens} tokens, not {max_tokens} (ignore_eos unheeded?)")
                total += tokens
            return total

        t0 = time.perf_counter()
        try:
            counts = await asyncio.gather(*(client(i) for i in range(clients)))
        except (aiohttp.ClientError, TimeoutError) as error:
            raise RuntimeError(f"port {port}: {error!r}") from error
        return sum(counts), time.perf_counter() - t0


def measure(port: int, model: str, clients: int, per_client: int, max_tokens: int) -> dict:
    tokens, wall_s = asyncio.run(_batch(port, model, clients, per_client, max_tokens))
    return {"clients": clients, "requests": clients * per_client, "tokens": tokens, "wall_s": wall_s,
            "tokens_per_s": tokens / wall_s}


# --- the run -------------------------------------------------------------------------------------------------


def _start(stack: contextlib.ExitStack, arm: str, isa: str, args: argparse.Namespace, binary: Path,
           cpus: set[int], extra: list[str]) -> tuple[int, str, dict]:
    """Starts `arm` (kept open by `stack`) and warms it up: (port, model id, what the report says of it)."""
    env = dict(os.environ)
    if arm == PEER:
        env = {k: v for k, v in env.items() if k not in OMP_DEFAULTS}
    else:
        env.update(ISA_ENV if isa == "avx2" else {})
        if args.flotilla_threads == "same":
            env["OMP_NUM_THREADS"] = str(len(cpus))
    cmd = _server_command(arm, args, free_port(), len(cpus), binary) + extra
    server = stack.enter_context(running(arm, cmd, env, cpus, "/health" if arm == PEER else "/readyz"))
    model = json.loads(_get(server.port, "/v1/models")[1])["data"][0]["id"]
    try:
        measure(server.port, model, max(args.clients), 1, 8)  # warm-up: every batch size's first step
        measure(server.port, model, 1, 2, args.max_tokens)
    except RuntimeError as error:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(5)
        if server.proc.returncode == -signal.SIGSEGV:
            raise Crashed(f"{arm} died of SIGSEGV warming up") from error
        raise
    threads = next((line.split("engine threads: ", 1)[1] for line in server.log.read_text(errors="replace").splitlines()
                    if "engine threads: " in line), None)
    shown = {k: env[k] for k in (*ISA_ENV, "OMP_NUM_THREADS") if arm != PEER and k in env}
    return server.port, model, {"command": " ".join(cmd), "env": shown, "engine_threads": threads}


def run_isa(isa: str, args: argparse.Namespace, binary: Path, cpus: set[int], log) -> tuple[list[dict], dict]:
    """Every batch of one ISA run, and each server's command line."""
    arms = [a for a in ARMS if args.with_float32 or a != "flotilla-float32"]
    runs, servers, ports = [], {}, {}
    with contextlib.ExitStack() as stack:
        for arm in arms:  # one after another: Flotilla measures its threads at start, alone
            try:
                port, model, servers[arm] = _start(stack, arm, isa, args, binary, cpus, [])
            except Crashed as crash:
                if arm != PEER:
                    raise
                # ggml's AMX matmul segfaulted in ldtilecfg on the KVM guest this was written on (AMX usable
                # there by other code): llama-server then runs without its extra buffer types, AMX among them
                log(f"{isa}: {crash}; starting it again with --no-repack")
                port, model, servers[arm] = _start(stack, arm, isa, args, binary, cpus, ["--no-repack"])
                servers[arm]["fallback"] = f"{crash}; ran with --no-repack (no AMX or repacked weights)"
            ports[arm] = (port, model)
            log(f"{isa}: {arm} ready on port {port}")
        for r in range(args.rounds):
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                for clients in args.clients:
                    per = args.requests_per_client or default_requests_per_client(clients)
                    row = {"isa": isa, "server": arm, "round": r + 1, **measure(*ports[arm], clients, per, args.max_tokens)}
                    runs.append(row)
                    log(f"{isa} round {r + 1}: {arm} at {clients} clients: {row['tokens_per_s']:.1f} tok/s")
    return runs, servers


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="The GGUF file both servers serve (default: SmolLM2-135M-Instruct "
                   "Q4_1, from the cache `make model` fills).")
    p.add_argument("--isa", choices=("native", "avx2", "both"), default="both",
                   help="native: as the machine runs; avx2: Flotilla's AVX2 paths forced against llama-server built "
                        "for AVX2; both: one run of each.")
    p.add_argument("--clients", type=int, action="append", help="Concurrent streaming clients, repeatable "
                   "(default: 1 and 16).")
    p.add_argument("--rounds", type=int, default=3, help="Interleaved rounds; the median is reported.")
    p.add_argument("--max-tokens", type=int, default=64, help="Output tokens of each request (ignore_eos).")
    p.add_argument("--requests-per-client", type=int, help="Requests each client sends one after another "
                   "(default: 4 at 1 client, 2 above).")
    p.add_argument("--threads", type=int, help="CPUs both servers run on (default: every CPU this process may use).")
    p.add_argument("--flotilla-threads", choices=("same", "default"), default="same",
                   help="same: Flotilla computes on --threads threads (OMP_NUM_THREADS), as llama-server does; "
                        "default: its own count, a core left to HTTP (docs/serving.md, CPU threads).")
    p.add_argument("--with-float32", action=argparse.BooleanOptionalAction, default=True,
                   help="Also run Flotilla on the dequantized float32 weights (--quantization none).")
    p.add_argument("--json", type=Path, help="Write every batch, the medians, ratios and the machine here.")
    p.add_argument("--plot", type=Path, help="Write a PNG of the medians here.")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from flotilla_server.bench.llama_server_build import BuildError, ensure_llama_server

    if args.model is None:
        from flotilla_server.bench.workloads import smollm2_path

        args.model = smollm2_path()
    args.clients = sorted(set(args.clients or [1, 16]))
    usable = sorted(os.sched_getaffinity(0))
    if problem := check_args(args, len(usable)):
        print(f"flotilla-bench llamacpp: {problem}", file=sys.stderr)
        return 2
    cpus = set(usable[:args.threads or len(usable)])
    isas = ["native", "avx2"] if args.isa == "both" else [args.isa]
    try:
        binaries = {isa: ensure_llama_server(isa, log=lambda m: print(m, file=sys.stderr)) for isa in isas}
    except (BuildError, subprocess.CalledProcessError, OSError) as error:
        print(f"flotilla-bench llamacpp: llama-server: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _interrupt)  # so that every server started is stopped
    runs, servers = [], {}
    try:
        for isa in isas:
            isa_runs, servers[isa] = run_isa(isa, args, binaries[isa], cpus, lambda m: print(m, file=sys.stderr))
            runs += isa_runs
    except RuntimeError as error:
        print(f"flotilla-bench llamacpp: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flotilla-bench llamacpp: interrupted; every server it started is stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    medians = median_table(runs)
    ratios = ratio_table(medians)
    version = {isa: subprocess.run([str(b), "--version"], capture_output=True, text=True).stderr.strip().splitlines()
               for isa, b in binaries.items()}
    per_client = {str(c): args.requests_per_client or default_requests_per_client(c) for c in args.clients}
    config = {"model": str(args.model), "isas": isas, "clients": args.clients, "rounds": args.rounds,
              "max_tokens": args.max_tokens, "requests_per_client": per_client, "cpus": sorted(cpus),
              "flotilla_threads": args.flotilla_threads,
              "llama_server": {i: [str(binaries[i]), *version[i]] for i in isas}}
    report = {"config": config, "cpu": cpu_info(), "servers": servers, "runs": runs, "medians": medians,
              "ratios": ratios, "targets": targets(ratios)}
    print(markdown_table(medians, ratios))
    for t in report["targets"]:
        if not t["met"]:
            print(f"below 1.0x: {t['isa']}, {t['clients']} clients, {t['ratio']} = {t['value']:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        from flotilla_server.bench.llama_compare_plot import plot_llama

        plot_llama(report, args.plot)
    return 0
