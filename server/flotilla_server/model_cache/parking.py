"""The parked models of a pool server: evicted models whose engine process kept its weights, so that a reload
skips the fork and the read (docs/architecture.md, "Parked models").

Where parked weights live: on CPU, a parked file under --parked-dir, memory-mapped by the parked process
(clean page-cache pages: the kernel may drop them and read them again from the file); on a GPU, pinned host
memory in that process. What a parked model costs is its parked weights plus its process's own memory; the
sum and the count are bounded (--parked-memory, --max-parked-models: parked_policy.parked_victims).

Rules:
- a parked copy is used only while its process lives and its source and parked file are unchanged
  (parked_policy.source_stamp); else it is stopped and the model loads from its source;
- each park writes a new file: a woken engine still maps the one it was parked in, which is deleted once
  that engine is parked again or stopped;
- the folder is this server's own (a fresh one inside --parked-dir), removed with everything in it at close.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flotilla_server.engine.backends import ParkedEngine, ProcessBackend
from flotilla_server.engine.messages import EngineStartError
from flotilla_server.model_cache.parked_policy import (
    ParkedCost,
    Stamp,
    file_stamp,
    parked_victims,
    source_stamp,
)

log = logging.getLogger("flotilla.model_cache")

PARK_TIMEOUT_S = 60.0  # writing a parked file of a few GiB; an engine that takes longer is stopped instead
_MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


@dataclass(frozen=True)
class ParkingConfig:
    limit_bytes: int  # --parked-memory; 0: no model is parked
    max_models: int  # --max-parked-models; 0: no model is parked
    directory: str | None = None  # --parked-dir; None: the system's temporary folder

    @property
    def enabled(self) -> bool:
        return self.limit_bytes > 0 and self.max_models > 0


@dataclass(frozen=True)
class ParkedStatus:
    name: str
    weight_bytes: int  # the parked weights: the parked file (page cache) on CPU, pinned host memory on a GPU
    anonymous_bytes: int  # the parked process's own memory
    parked_s: float  # seconds since it was parked

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.anonymous_bytes


@dataclass
class _Parked:
    name: str
    key: tuple[str, str | None]  # (source, quantization): a parked copy serves only the same
    source_stamp: Stamp
    file_stamp: Stamp
    engine: ParkedEngine
    parked_at_s: float

    @property
    def bytes(self) -> int:
        return self.engine.parked.weight_bytes + self.engine.parked.anonymous_bytes


class ParkedModels:
    def __init__(self, config: ParkingConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()  # the load worker parks and takes; the HTTP side reads status()
        self._parked: dict[str, _Parked] = {}
        self._mapped: dict[int, str] = {}  # engine pid -> the parked file a woken engine still maps
        self._folder: Path | None = None
        self._count = 0

    def start(self) -> None:
        if not self.config.enabled:
            return
        parent = Path(self.config.directory or tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self._folder = Path(tempfile.mkdtemp(prefix="flotilla-parked-", dir=parent))
        fs = _filesystem_of(self._folder)
        if fs in _MEMORY_FILESYSTEMS:
            log.warning("--parked-dir %s is on %s: parked weights there are memory that the kernel cannot drop; "
                        "point --parked-dir at a disk-backed folder", parent, fs)

    def close(self) -> None:
        with self._lock:
            parked, self._parked = list(self._parked.values()), {}
        for p in parked:
            p.engine.stop()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def park(self, name: str, source: str, quantization: str | None, backend: ProcessBackend, stamp: Stamp,
             tokenizer: Any = None, loading: str | None = None) -> bool:
        """Park a loaded model's engine (no request in flight); False if it could not (then it is stopped).
        `stamp`: its source's, taken before its weights were read (a change during its residence counts);
        `tokenizer`: kept here for its wake (ParkedEngine.tokenizer); `loading`: the model whose load evicts
        this one, never let go to make room (parked_policy.parked_victims)."""
        if self._folder is None:
            return False
        self._count += 1
        path = self._folder / f"{re.sub(r'[^A-Za-z0-9._-]', '_', name)}-{backend.process.pid}-{self._count}.parked"
        old_file = self._mapped.pop(backend.process.pid, None)
        start_s = time.monotonic()
        try:
            engine = backend.park(str(path), PARK_TIMEOUT_S)
        except EngineStartError as e:
            log.warning("model %s: not parked (%s); its next load reads %s", name, e, source)
            path.unlink(missing_ok=True)
            if old_file is not None:
                Path(old_file).unlink(missing_ok=True)
            return False
        if old_file is not None and old_file != engine.parked.path:
            Path(old_file).unlink(missing_ok=True)  # else its weights were mapped from it: parked again in place
        engine.tokenizer = tokenizer
        parked = _Parked(name, (source, quantization), stamp,
                         file_stamp(engine.parked.path) if engine.parked.path else (), engine, self._clock())
        log.info("model %s parked in %.2f s: %d bytes of weights (%s), %d bytes of its process", name,
                 time.monotonic() - start_s, engine.parked.weight_bytes, engine.parked.path or "pinned host memory",
                 engine.parked.anonymous_bytes)
        with self._lock:
            self._parked[name] = parked
            costs = [ParkedCost(p.name, p.bytes, p.parked_at_s) for p in self._parked.values()]
            victims = [self._parked.pop(n) for n in parked_victims(costs, self.config.limit_bytes,
                                                                   self.config.max_models, loading)]
        for victim in victims:
            log.info("model %s: no longer parked (--parked-memory %d, --max-parked-models %d)", victim.name,
                     self.config.limit_bytes, self.config.max_models)
            self._stop(victim)
        return name not in {v.name for v in victims}

    def take(self, name: str, source: str, quantization: str | None) -> ParkedEngine | None:
        """The model's parked engine if it can still serve this source, now no longer parked; else None."""
        with self._lock:
            parked = self._parked.pop(name, None)
        if parked is None:
            return None
        why = None
        if parked.key != (source, quantization):
            why = "its source changed in the model list"
        elif not parked.engine.alive:
            why = f"its process {parked.engine.process.pid} is gone (exit code {parked.engine.process.exitcode})"
        elif parked.source_stamp != source_stamp(source):
            why = f"{source} changed since it was parked"
        elif parked.engine.parked.path and parked.file_stamp != file_stamp(parked.engine.parked.path):
            why = f"its parked file {parked.engine.parked.path} changed or is gone"
        if why is not None:
            log.info("model %s: its parked copy is not used (%s); it loads from %s", name, why, source)
            self._stop(parked)
            return None
        if parked.engine.parked.path:
            self._mapped[parked.engine.process.pid] = parked.engine.parked.path
        return parked.engine

    def drop(self, name: str) -> None:
        """Stop the model's parked copy, if any (the model left the list)."""
        with self._lock:
            parked = self._parked.pop(name, None)
        if parked is not None:
            self._stop(parked)

    def ended(self, pid: int) -> None:
        """An engine that may map a parked file stopped: its file goes."""
        path = self._mapped.pop(pid, None)
        if path is not None:
            Path(path).unlink(missing_ok=True)

    def status(self) -> list[ParkedStatus]:
        now = self._clock()
        with self._lock:
            return [ParkedStatus(p.name, p.engine.parked.weight_bytes, p.engine.parked.anonymous_bytes,
                                 now - p.parked_at_s) for p in self._parked.values()]

    def _stop(self, parked: _Parked) -> None:
        parked.engine.stop()
        if parked.engine.parked.path:
            Path(parked.engine.parked.path).unlink(missing_ok=True)


def _filesystem_of(path: Path) -> str | None:
    """The type of the filesystem holding `path` (/proc/mounts' longest matching mount point), or None."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    best = max((m for m in mounts if str(path.resolve()).startswith(m[0].rstrip("/") + "/") or m[0] == "/"),
               key=lambda m: len(m[0]), default=None)
    return best[1] if best else None
