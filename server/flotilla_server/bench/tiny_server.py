"""A real `flotilla-server` on tiny in a child process, for the benchmarks that measure it over HTTP.

The benchmarks start one server per arm or mode, so that no arm inherits another's queue, caches or heap;
each server is stopped the way a user stops it (two SIGINTs: drain, then exit) and killed only if it
outlives that by 30 s.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

START_TIMEOUT_S = 300


class StartFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class TinyServer:
    port: int
    pid: int


@contextlib.contextmanager
def tiny_server(*flags: str, model: str = "tiny") -> Iterator[TinyServer]:
    """Serves `model` (tiny unless named) on a free port with `flags` until the block ends; StartFailed names
    the server's last line on stderr when it exits or is not ready within START_TIMEOUT_S."""
    port = free_port()
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", model, "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", *flags]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not is_ready(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    lines = [x.strip() for x in err.read().decode(errors="replace").splitlines() if x.strip()]
                    why = lines[-1] if lines else f"exit status {proc.poll()}"
                    raise StartFailed(f"flotilla-server {' '.join(flags) or '(default flags)'} did not start: {why}")
                time.sleep(0.2)
            yield TinyServer(port, proc.pid)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(16).startswith(b"HTTP/1.1 200")
    except OSError:
        return False
