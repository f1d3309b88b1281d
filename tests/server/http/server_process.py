"""Start a real `flotilla-server` process on a free port for HTTP tests, and always stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[3]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample at /metrics, keyed by (name, sorted labels without `model`)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model"))
                out[(s.name, labels)] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)


@contextlib.contextmanager
def run_server(*args: str, tmp_path: Path, startup_timeout_s: float = 120.0,
               env: dict[str, str] | None = None, model_args: tuple[str, ...] = ("--model", "tiny"),
               cpus: set[int] | None = None) -> Iterator[ServerProcess]:
    """`model_args` replace `--model tiny` (multi-model servers name their models). `cpus`: the only cores
    the server and its engines may run on (its usable CPUs); it then derives OMP_NUM_THREADS from them."""
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    cmd = [sys.executable, "-m", "flotilla_server.cli", *model_args, "--host", "127.0.0.1",
           "--port", str(port), *args]
    full_env = {**os.environ, **(env or {})}
    if "--dtype" not in (*args, *model_args):
        # float32 on every machine unless a test asks (`--dtype auto` picks bfloat16 on some CPUs)
        full_env.setdefault("FLOTILLA_DTYPE", "float32")
    if cpus is not None:
        full_env.pop("OMP_NUM_THREADS", None)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=full_env,
                                preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"flotilla-server exited with {proc.returncode}:\n{server.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.base_url}/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"flotilla-server not ready after {startup_timeout_s} s:\n{server.log()}")
            time.sleep(0.2)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGINT)  # the second signal skips the drain
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Streams:
    """Streams started by `start_streams`: each one's last two SSE lines once it has ended."""

    threads: list[threading.Thread]
    endings: list[str] = field(default_factory=list)

    def join(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout=timeout_s)
            assert not t.is_alive(), "a stream hung"


def start_streams(base_url: str, count: int, max_tokens: int, timeout_s: float = 60.0) -> Streams:
    """`count` streamed completions of `max_tokens`, returned once every one has its first token."""
    body = {"model": "tiny", "prompt": "a long answer", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    started = threading.Barrier(count + 1)
    streams = Streams([])

    def stream() -> None:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=timeout_s) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    break
            started.wait()
            chunks = [line for line in lines if line.startswith("data: ")]
            streams.endings.append(chunks[-2] + chunks[-1] if len(chunks) > 1 else repr(chunks))

    streams.threads = [threading.Thread(target=stream) for _ in range(count)]
    for t in streams.threads:
        t.start()
    started.wait(timeout=timeout_s)
    return streams
