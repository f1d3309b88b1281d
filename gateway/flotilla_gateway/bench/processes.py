"""What the gateway's benchmarks share: free ports, child processes stopped however the bench ends, waiting for
an HTTP service to answer, percentiles, and a process's own CPU time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process's threads have used, to the nanosecond (schedstat), a figure the
    neighbours' noise does not inflate; falls back to /proc/PID/stat (clock ticks) without schedstat."""
    try:
        return sum(int((task / "schedstat").read_text().split()[0])
                   for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def process(command: list[str], log: Path, env: dict[str, str] | None = None,
            stop: signal.Signals = signal.SIGTERM) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, sent `stop` (then killed after 10 s) when the block ends."""
    with log.open("wb") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield child
    finally:
        child.send_signal(stop)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


async def wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout_s} s")
            await asyncio.sleep(0.1)
