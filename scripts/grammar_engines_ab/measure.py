"""Small timing and statistics helpers shared by every section: medians and percentiles, the clock, the
interleaved round order, stderr capture for library warnings, package and CPU facts for the result's
metadata, the GIL probe and the bitmask popcount; none of them imports either grammar library.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def now() -> float:
    return time.perf_counter()


def round_orders(libs: tuple[str, ...], rounds: int) -> Iterator[tuple[int, str]]:
    """Interleaved: round r runs the libraries in order, the next round in reverse."""
    for r in range(rounds):
        for lib in (libs if r % 2 == 0 else tuple(reversed(libs))):
            yield r, lib


@contextlib.contextmanager
def captured_stderr() -> Iterator[dict[str, str]]:
    """Captures what native code and Python write to fd 2 (library warnings) into out['text']."""
    out: dict[str, str] = {"text": ""}
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            import warnings
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            text += "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
            out["text"] = text.strip()


def short(msg: str, n: int = 160) -> str:
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def pkg_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {"machine": platform.machine(), "nproc": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "Model name":
                info["model_name"] = val.strip()
            if key.strip() == "Flags":
                flags = val.split()
                info["avx2"] = "avx2" in flags
                info["avx512f"] = "avx512f" in flags
                info["amx"] = "amx_tile" in flags
    except OSError:
        pass
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = os.getloadavg()
    return info


def gil_probe(fn: Callable[[], None]) -> dict[str, float]:
    """Runs fn on a thread while this thread counts in pure Python; the count rate against the rate alone
    says how much of the time fn left the GIL free (on a machine with a core for each)."""
    def count(stop: Callable[[], bool]) -> tuple[int, float]:
        n, t0 = 0, now()
        while not stop():
            for _ in range(1000):
                n += 1
        return n, now() - t0
    end = now() + 0.3
    n0, d0 = count(lambda: now() > end)
    th = threading.Thread(target=fn)
    t0 = now()
    th.start()
    n1, d1 = count(lambda: not th.is_alive())
    th.join()
    return {"fn_s": round(now() - t0, 4), "main_thread_speed_kept": round((n1 / d1) / (n0 / d0), 3)}


def popcount_rows(bm: Any) -> Any:
    import torch
    bits = (bm.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.sum(dim=(-1, -2))
