"""Model weights are loaded in a helper process, at a lower priority and on one thread, and handed to the
server through shared memory.

Why a process: a load on a thread of the server shares the GIL with the resident models' engine threads,
and a niced thread that holds the GIL stalls them (priority inversion). Measured on the shared 2-core
box, a resident tiny model stepped at 13-21 steps/s while a 100 MB model loaded on a thread (niced or not)
against 40-47 idle; with the load in a niced process, its rate did not drop. The server then only
assembles the model around the shared tensors (no copy on CPU). The helper is started once and reused
(docs/architecture.md, "Model cache").
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

log = logging.getLogger("flotilla.model_cache")

LOAD_NICE = 10  # added to the server's niceness: resident models' engines go first
_POLL_S = 1.0  # how often a wait for the helper checks that it is still alive


def _helper(requests: Any, replies: Any) -> None:
    """The helper's loop: (source, dtype) in, ("ok", state_dict) or ("error", message) out; each reply is
    acknowledged before the helper drops its own references to the tensors."""
    os.nice(LOAD_NICE)
    import torch

    torch.set_num_threads(1)
    from flotilla_server.model import load_model

    while True:
        request = requests.get()
        if request is None:
            return
        source, dtype = request
        try:
            weights = dict(load_model(source, dtype, "cpu").model.state_dict())
        except Exception as e:  # a broken model fails its load, never the helper
            replies.put(("error", f"{type(e).__name__}: {e}"))
            continue
        replies.put(("ok", weights))
        requests.get()  # the server holds the tensors now
        del weights


class WeightsProcess:
    """One helper process; `load` is called from one thread at a time (the cache's load worker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None

    def _start(self) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")  # never fork a process that runs engine threads
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        self._process = ctx.Process(target=_helper, args=(self._requests, self._replies),
                                    name="flotilla-weights-loader", daemon=True)
        self._process.start()

    def start(self) -> None:
        with self._lock:
            if self._process is None or not self._process.is_alive():
                self._start()

    def load(self, source: str, dtype: str) -> dict:
        """The decoder's state dict, in shared memory; ValueError with the helper's message if it failed."""
        with self._lock:
            if self._process is None or not self._process.is_alive():
                self._start()
            self._requests.put((source, dtype))
            while True:
                try:
                    status, payload = self._replies.get(timeout=_POLL_S)
                    break
                except queue.Empty:
                    if not self._process.is_alive():
                        code = self._process.exitcode
                        self._process = None
                        raise RuntimeError(f"the weights loader process died (exit code {code}) "
                                           f"loading {source}; see the server's log") from None
            if status != "ok":
                raise ValueError(payload)
            self._requests.put("ack")
            return payload

    def close(self) -> None:
        with self._lock:
            if self._process is not None and self._process.is_alive():
                self._requests.put(None)
                self._process.join(5)
                if self._process.is_alive():
                    self._process.kill()
            self._process = None
