"""Run the real `flotilla-operator` as a subprocess against a test API server, and stop it for sure.

    with serve(tmp_path, crds=[crd]) as k8s, operator_process(k8s.kubeconfig, tmp_path, "--drift-interval-s", "2") as op:
        ...
        op.kill()        # SIGKILL, as a node loss would; the context still cleans up
"""

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

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    health_port: int
    metrics_port: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def answers(self) -> bool:
        """/healthz answers, whatever its status (a failing probe answers 500)."""
        try:
            httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1)
            return True
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


def start_operator(kubeconfig: str, log_path: Path, *args: str, namespace: str | None = "default",
                   ready_timeout_s: float = 60.0, wait_healthy: bool = True) -> OperatorProcess:
    """Start the operator watching `namespace` (None: all namespaces) and wait until /healthz answers
    (`wait_healthy` False: until it answers at all, healthy or not). Standalone unless `args` hold --peering."""
    health_port, metrics_port = free_port(), free_port()
    scope = ["--namespace", namespace] if namespace else ["--all-namespaces"]
    peering = [] if any(a == "--peering" or a.startswith("--peering=") for a in args) else ["--standalone"]
    command = [
        sys.executable, "-m", "flotilla_operator.cli", *scope, *peering,
        "--health-port", str(health_port), "--metrics-port", str(metrics_port), "--verbose", *args,
    ]
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    op = OperatorProcess(process, log_path, health_port, metrics_port)
    deadline = time.monotonic() + ready_timeout_s
    while not (op.healthy() if wait_healthy else op.answers()):
        if process.poll() is not None or time.monotonic() > deadline:
            op.kill()
            raise RuntimeError(f"flotilla-operator did not become healthy:\n{op.log()[-4000:]}")
        time.sleep(0.1)
    return op


@contextlib.contextmanager
def operator_process(kubeconfig: str, directory: Path, *args: str, namespace: str | None = "default") -> Iterator[OperatorProcess]:
    op = start_operator(kubeconfig, directory / "operator.log", *args, namespace=namespace)
    try:
        yield op
    finally:
        op.stop()
