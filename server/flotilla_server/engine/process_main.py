"""The engine process's entry point: load the model, say ready, then run the engine loop over a pipe.

Started with `spawn` (a fresh interpreter: no copied locks, threads or CUDA state), or, in a multi-model
server, forked from a `forkserver` that imported torch once and never ran anything (engine/backends.py). It
ignores SIGINT and SIGTERM, so Ctrl-C and a pod's SIGTERM drain through the HTTP process, and it exits
when its pipe closes or its parent changes: a parent that was SIGKILLed leaves no orphan holding memory or
a GPU. Under `spawn`, torch loads only inside `run_engine_process`, after the thread count is set.

With `load_nice` or `load_threads` set, the model loads on a thread of its own at that lower priority and
thread count, while the main thread waits; the main thread then runs the engine loop at the process's own
priority. Linux keeps a nice value per thread, and an unprivileged thread can raise its own but never
lower it again, so only a thread that exists for the load can be niced and the engine still run at full
priority after it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.messages import EngineFailed, EngineOptions, EngineUpdate
from flotilla_server.engine.parent_watch import exit_with_parent

if TYPE_CHECKING:
    from flotilla_server.engine.loop import EngineLoop, Inbox

log = logging.getLogger("flotilla.engine")


class PipeInbox:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def wait(self, timeout_s: float | None) -> bool:
        return self._conn.poll(timeout_s)  # also True when the other end closed; get() then raises EOFError

    def get(self):
        return self._conn.recv()


def _build(config: EngineConfig, options: EngineOptions) -> EngineLoop:
    import torch

    if options.num_threads is not None:
        torch.set_num_threads(options.num_threads)
    from flotilla_server.engine.loop import build_loop

    return build_loop(config, options)


def _load(config: EngineConfig, options: EngineOptions) -> EngineLoop:
    """Build the engine on a thread niced by `load_nice` with `load_threads` torch threads; then give this
    (the main, un-niced) thread the engine's own thread count back."""
    outcome: list = []

    def load() -> None:
        try:
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + options.load_nice)
            import torch

            outcome.append(options.num_threads or torch.get_num_threads())
            if options.load_threads:
                torch.set_num_threads(options.load_threads)
            from flotilla_server.engine.loop import build_loop

            outcome.append(build_loop(config, options))
        except BaseException as e:  # raised again on the main thread
            outcome[:] = [e]

    loader = threading.Thread(target=load, name="flotilla-model-load")
    loader.start()
    loader.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    threads, loop = outcome
    import torch

    torch.set_num_threads(threads)  # the global count, and OpenMP's for this thread, which runs the steps
    return loop


def run_engine_process(config: EngineConfig, options: EngineOptions, conns: list[Connection]) -> None:
    """`conns`: one pipe per HTTP process (engine/front_inbox.py); the first hears whether the engine started."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if options.num_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(options.num_threads)  # read once, when torch loads OpenMP
    exit_with_parent()  # even in the middle of a long step (the loop notices a closed pipe only between steps)
    try:
        loop = _load(config, options) if options.load_nice or options.load_threads else _build(config, options)
        if options.measure_threads:
            loop.core.measure_threads()
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        conns[0].send(EngineFailed(str(e)))
        sys.exit(1)
    from flotilla_server.engine.loop import serve_inbox
    from flotilla_server.engine.startup_heap import freeze_startup_heap

    freeze_startup_heap()
    conns[0].send(loop.info(os.getpid()))
    if len(conns) == 1:
        inbox: Inbox = PipeInbox(conns[0])
        send: Callable[[EngineUpdate], None] = conns[0].send
    else:
        from flotilla_server.engine.front_inbox import FrontInbox

        fronts = FrontInbox(conns)
        inbox, send = fronts, fronts.send
    try:
        serve_inbox(loop, inbox, send)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        log.info("the HTTP side is gone; the engine process exits")
    except Exception:
        log.exception("engine loop failed; the engine process exits")
        sys.exit(1)
