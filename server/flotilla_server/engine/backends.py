"""Where the engine loop runs: its own process (the default) or a thread of this one (tests, comparison).

Both run engine/loop.py's `serve_inbox` and hand every `EngineUpdate` to `on_update`, on a thread of
this process that is not the event loop; `on_death` is called once if the loop ends without being told to.
Messages are sent from any thread and never block the caller: a sender thread writes the pipe, so a step
that keeps the engine from reading never stalls the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.messages import (
    EngineFailed,
    EngineInfo,
    EngineOptions,
    EngineStartError,
    EngineUpdate,
    Shutdown,
)
from flotilla_server.engine.park_messages import LoadPhases, Park, Parked, Wake

log = logging.getLogger(__name__)

OnUpdate = Callable[[EngineUpdate], None]
OnDeath = Callable[[str], None]


class _QueueInbox:
    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self._next: list[Any] = []

    def wait(self, timeout_s: float | None) -> bool:
        if self._next:
            return True
        try:
            self._next.append(self.queue.get(timeout=timeout_s) if timeout_s != 0 else self.queue.get_nowait())
        except queue.Empty:
            return False
        return True

    def get(self) -> Any:
        if not self._next:
            self.wait(None)
        return self._next.pop()


class ThreadBackend:
    """The in-process mode: the same loop on a thread; `loaded` reuses a model already in memory (tests)."""

    def __init__(self, config: EngineConfig, options: EngineOptions, loaded: Any = None) -> None:
        self._config, self._options, self._loaded = config, options, loaded
        self._inbox = _QueueInbox()
        self._thread: threading.Thread | None = None

    def start(self, on_update: OnUpdate, on_death: OnDeath) -> EngineInfo:
        from flotilla_server.engine.loop import build_loop, serve_inbox  # torch loads here, not at import

        try:
            loop = build_loop(self._config, self._options, self._loaded)
        except (ValueError, FileNotFoundError) as e:
            raise EngineStartError(str(e)) from None

        measured = threading.Event()
        failed: list[Exception] = []

        def run() -> None:
            try:
                if self._options.measure_threads:
                    loop.core.measure_threads()  # the count is this thread's
            except Exception as e:
                failed.append(e)
                return
            finally:
                measured.set()
            try:
                serve_inbox(loop, self._inbox, on_update)
            except Exception as e:
                log.exception("engine loop failed")
                on_death(f"engine loop failed: {type(e).__name__}: {e}")

        self._thread = threading.Thread(target=run, name="flotilla-engine", daemon=True)
        self._thread.start()
        measured.wait()
        if failed:
            raise EngineStartError(f"measuring the engine's thread count failed: {failed[0]}")
        return loop.info(os.getpid())

    def send(self, message: Any) -> None:
        self._inbox.queue.put(message)

    def close(self, timeout_s: float) -> None:
        self.send(Shutdown())
        if self._thread is not None:
            self._thread.join(timeout_s)


# What a forkserver imports once, before it forks any engine: torch, the engine, and what torch imports
# lazily on a first model build (engine/forkserver_preload.py): ~7 s of CPU on a 2-core box, against ~0.1 s
# to fork, so that a multi-model server's every load skips them.
FORKSERVER_PRELOAD = ("flotilla_server.engine.forkserver_preload",)
START_METHODS = ("spawn", "forkserver")


def start_forkserver() -> None:
    """Start the forkserver now (it imports FORKSERVER_PRELOAD in the background), so that the first load is
    as quick as the next; it exits with this process. Call it before any thread of this process is niced:
    the forkserver, and every engine forked from it, inherit the caller's priority and environment."""
    from multiprocessing import forkserver

    mp.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    forkserver.ensure_running()


@dataclass
class EngineProcess:
    """A started engine process and the parent ends of its pipes, one per HTTP process."""

    process: Any
    conns: list[Any]
    info: EngineInfo
    phases: LoadPhases | None = None  # what its start took, measured in it

    def stop(self, timeout_s: float) -> None:
        """Wait up to timeout_s for it to exit (its pipes closed, or Shutdown sent), then kill it."""
        self.process.join(timeout_s)
        _kill(self.process)


def spawn_engine(config: EngineConfig, options: EngineOptions, *, fronts: int = 1, start_method: str = "spawn",
                 startup_timeout_s: float = 600.0, parkable: bool = False) -> EngineProcess:
    """Start the engine process with `fronts` pipes and wait until it has loaded; raises EngineStartError.
    `parkable` (one pipe): it warms up before saying ready and takes Park and Wake (ProcessBackend.park)."""
    from flotilla_server.engine.process_main import run_engine_process

    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
    if start_method == "forkserver":
        start_forkserver()  # at once if already running
    ctx = mp.get_context(start_method)
    pipes = [ctx.Pipe(duplex=True) for _ in range(fronts)]
    process = ctx.Process(target=run_engine_process, args=(config, options, [child for _, child in pipes], parkable),
                          name=f"flotilla-engine[{config.model}]", daemon=True)
    process.start()
    for _, child in pipes:
        child.close()  # only the child holds its ends: its death is our EOF
    phases, info = _await_start(process, pipes[0][0], time.monotonic() + startup_timeout_s)
    return EngineProcess(process, [parent for parent, _ in pipes], info, phases)


def _await_start(process: Any, conn: Any, deadline_s: float) -> tuple[LoadPhases | None, EngineInfo]:
    """The engine's LoadPhases and EngineInfo once it has started (or woken); EngineStartError otherwise."""
    phases = None
    while True:
        while not conn.poll(0.2):
            if not process.is_alive() or time.monotonic() > deadline_s:
                raise _exited(process)
        try:
            message = conn.recv()
        except EOFError:  # poll() also wakes on the child's death: its end closed before it said anything
            raise _exited(process) from None
        if isinstance(message, EngineFailed):
            _kill(process)
            raise EngineStartError(message.message)
        if not isinstance(message, LoadPhases):
            return phases, message
        phases = message


def _exited(process: Any) -> EngineStartError:
    _kill(process)
    return EngineStartError(f"the engine process exited during start-up (exit code {process.exitcode}); "
                            "its log above says why")


def _kill(process: Any) -> None:
    if process.is_alive():
        process.kill()  # it ignores SIGTERM by design
        process.join(5.0)


class _PipeBackend:
    """One pipe to an engine process, a reader and a sender thread here."""

    def __init__(self) -> None:
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._conn: Any = None
        self._closing = False
        self._parking: queue.SimpleQueue | None = None  # set by park(): where the reader puts Parked or None
        self._reader: threading.Thread | None = None
        self._writer: threading.Thread | None = None

    def _serve(self, conn: Any, on_update: OnUpdate, on_death: OnDeath) -> None:
        self._conn = conn
        self._reader = threading.Thread(target=self._read, args=(on_update, on_death), name="engine-reader",
                                        daemon=True)
        self._reader.start()
        self._writer = threading.Thread(target=self._write, name="engine-writer", daemon=True)
        self._writer.start()

    def _death(self) -> str:
        raise NotImplementedError

    def _read(self, on_update: OnUpdate, on_death: OnDeath) -> None:
        try:
            while True:
                message = self._conn.recv()
                if self._parking is not None and isinstance(message, (Parked, EngineFailed)):
                    self._parking.put(message)
                    return  # the pipe passes to the ParkedEngine
                on_update(message)
        except (EOFError, OSError):
            pass
        if self._parking is not None:
            self._parking.put(None)
        if not self._closing:
            on_death(self._death())

    def _write(self) -> None:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                self._conn.send(message)
            except (OSError, ValueError):
                return  # the engine is gone: the reader reports it
            if isinstance(message, (Shutdown, Park)):
                return

    def send(self, message: Any) -> None:
        self._outbox.put(message)


@dataclass
class ParkedEngine:
    """A parked engine process (engine/park_messages.py): no engine loop, its weights parked; it holds
    `parked.anonymous_bytes` of its own. Woken by a ProcessBackend made with it, or stopped."""

    process: Any
    conn: Any
    parked: Parked
    tokenizer: Any = None  # the parent's copy: a woken engine's EngineInfo comes without one

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the process: its memory, and its mapping of the parked file, are free on return."""
        with contextlib.suppress(OSError, ValueError):  # it may be gone already
            self.conn.send(Shutdown())
        self.process.join(timeout_s)
        _kill(self.process)
        self.conn.close()


class ProcessBackend(_PipeBackend):
    """The engine in its own process, `spawn`ed or forked by the forkserver (start_forkserver); with
    `parkable`, it can be parked (park) and a backend made with the ParkedEngine (`woken`) wakes it."""

    def __init__(self, config: EngineConfig, options: EngineOptions, startup_timeout_s: float = 600.0,
                 start_method: str = "spawn", parkable: bool = False, woken: ParkedEngine | None = None) -> None:
        super().__init__()
        self._config, self._options = config, options
        self._start_method = start_method
        self._startup_timeout_s = startup_timeout_s
        self._parkable = parkable or woken is not None
        self._woken = woken
        self.process: Any = None
        self.phases: LoadPhases | None = None  # what the start (or wake) took, measured in the engine process

    def start(self, on_update: OnUpdate, on_death: OnDeath) -> EngineInfo:
        if self._woken is not None:
            self.process, conn = self._woken.process, self._woken.conn
            try:
                conn.send(Wake(self._config, self._options))
                self.phases, info = _await_start(self.process, conn, time.monotonic() + self._startup_timeout_s)
            except (OSError, EngineStartError) as e:  # it died while parked, or its build failed
                _kill(self.process)
                conn.close()
                raise EngineStartError(f"the parked engine process {self.process.pid} did not wake: {e}") from None
            self._serve(conn, on_update, on_death)
            return info
        engine = spawn_engine(self._config, self._options, start_method=self._start_method,
                              startup_timeout_s=self._startup_timeout_s, parkable=self._parkable)
        self.process, self.phases = engine.process, engine.phases
        self._serve(engine.conns[0], on_update, on_death)
        return engine.info

    def park(self, path: str, timeout_s: float) -> ParkedEngine:
        """Park the engine: this backend stops serving (no death is reported) and the process and its pipe
        pass to the returned ParkedEngine. Call it with no request in flight. EngineStartError, the process
        stopped, if it cannot park (its weights could not be written, it died, it took over timeout_s)."""
        assert self._parkable and self.process is not None, "only a started parkable engine parks"
        self._closing, self._parking = True, queue.SimpleQueue()
        self.send(Park(path))
        try:
            reply = self._parking.get(timeout=timeout_s)
        except queue.Empty:
            reply = None
        for thread in (self._writer, self._reader):
            if thread is not None:
                thread.join(1.0)
        if not isinstance(reply, Parked) or (self._reader is not None and self._reader.is_alive()):
            _kill(self.process)
            self._conn.close()
            why = reply.message if isinstance(reply, EngineFailed) else "it did not answer"
            raise EngineStartError(f"the engine process {self.process.pid} could not park: {why}")
        parked = ParkedEngine(self.process, self._conn, reply)
        self.process = None  # the ParkedEngine's now: close() leaves it be
        return parked

    def _death(self) -> str:
        self.process.join(2.0)
        return f"the engine process (pid {self.process.pid}) exited with code {self.process.exitcode}"

    def close(self, timeout_s: float) -> None:
        """Stop the engine process and wait for it: its memory (and GPU memory) is free on return."""
        self._closing = True
        if self.process is None:
            return
        self.send(Shutdown())
        self.process.join(timeout_s)
        _kill(self.process)
        if self._conn is not None:
            self._conn.close()


class ConnectedBackend(_PipeBackend):
    """One of several HTTP processes' pipe to an engine process that another process started and stops
    (flotilla_server/fronts.py): closing says Shutdown for this HTTP process alone (engine/front_inbox.py)."""

    def __init__(self, conn: Any, info: EngineInfo) -> None:
        super().__init__()
        self._given_conn, self._info = conn, info

    def start(self, on_update: OnUpdate, on_death: OnDeath) -> EngineInfo:
        self._serve(self._given_conn, on_update, on_death)
        return self._info

    def _death(self) -> str:
        return f"the engine process (pid {self._info.pid}) closed its pipe"

    def close(self, timeout_s: float) -> None:
        self._closing = True
        self.send(Shutdown())
        deadline = time.monotonic() + timeout_s
        for thread in (self._writer, self._reader):  # the writer ends once Shutdown is written, the reader
            if thread is not None:                 # when the engine closes its end in answer
                thread.join(max(0.0, deadline - time.monotonic()))
        if self._reader is None or not self._reader.is_alive():
            self._conn.close()  # never under a reader still blocked on it
