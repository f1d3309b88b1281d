"""The engine process's entry point: load the model, say ready, then run the engine loop over a pipe.

Started with the `spawn` method (a fresh interpreter: no copied locks, threads or CUDA state). It ignores
SIGINT and SIGTERM, so Ctrl-C and a pod's SIGTERM drain through the HTTP process, and it exits when its
pipe closes: a parent that was SIGKILLed leaves no orphan holding memory or a GPU. Torch loads only inside
`run_engine_process`, after the thread count is set.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from multiprocessing.connection import Connection

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.messages import EngineFailed, EngineOptions

log = logging.getLogger("flotilla.engine")


class PipeInbox:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def wait(self, timeout_s: float | None) -> bool:
        return self._conn.poll(timeout_s)  # also True when the other end closed; get() then raises EOFError

    def get(self):
        return self._conn.recv()


def _watch_parent() -> None:
    """Exit when the parent dies even in the middle of a long step (the loop notices only between steps)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            threading.Event().wait(1.0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def run_engine_process(config: EngineConfig, options: EngineOptions, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if options.nice:
        os.nice(options.nice)
    if options.num_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(options.num_threads)
    _watch_parent()
    try:
        import torch

        if options.num_threads is not None:
            torch.set_num_threads(options.num_threads)
        from flotilla_server.engine.loop import build_loop, serve_inbox

        loop = build_loop(config, options)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        conn.send(EngineFailed(str(e)))
        sys.exit(1)
    conn.send(loop.info(os.getpid()))
    try:
        serve_inbox(loop, PipeInbox(conn), conn.send)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        log.info("the HTTP process is gone; the engine process exits")
    except Exception:
        log.exception("engine loop failed; the engine process exits")
        sys.exit(1)
