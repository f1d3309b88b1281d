"""Start a real `flotilla-server` process on a free port for HTTP tests, and always stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
               ) -> Iterator[ServerProcess]:
    """`model_args` replace `--model tiny` (multi-model servers name their models)."""
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    cmd = [sys.executable, "-m", "flotilla_server.cli", *model_args, "--host", "127.0.0.1",
           "--port", str(port), *args]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, **(env or {})})
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
