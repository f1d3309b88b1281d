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

A pool's engine (`parkable`) also answers Park: its loop ends, its weights are parked (model/parked_weights.py)
and the process waits for Wake, which builds the engine again on them (engine/park_messages.py). Each start
and wake sends LoadPhases (read, build, warm-up seconds) before its EngineInfo.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.messages import EngineFailed, EngineOptions, EngineUpdate, Shutdown
from flotilla_server.engine.parent_watch import exit_with_parent
from flotilla_server.engine.park_messages import LoadPhases, Park, Parked, Wake

if TYPE_CHECKING:
    from flotilla_server.engine.loop import EngineLoop, Inbox
    from flotilla_server.model import LoadedModel

log = logging.getLogger("flotilla.engine")

WARM_UP_REQUEST_ID = "flotilla-warm-up"
PARKED_IDLE_GC_S = 1.0  # a parked process collects its closed loop's garbage after this long without a Wake
PARKED_GC_EVERY = 4  # ...or at once after this many parks whose collection a quick Wake put off


class PipeInbox:
    """The loop's messages from one pipe; with `parkable`, a Park ends the loop as Shutdown does, kept in `park`."""

    def __init__(self, conn: Connection, parkable: bool = False) -> None:
        self._conn = conn
        self._parkable = parkable
        self.park: Park | None = None

    def wait(self, timeout_s: float | None) -> bool:
        return self._conn.poll(timeout_s)  # also True when the other end closed; get() then raises EOFError

    def get(self):
        message = self._conn.recv()
        if self._parkable and isinstance(message, Park):
            self.park = message
            return Shutdown()
        return message


def _read_and_build(config: EngineConfig, options: EngineOptions, loaded: LoadedModel | None) -> tuple[EngineLoop, float, float]:
    """(the loop, read seconds, build seconds): the model read unless `loaded` is given, then the engine on it."""
    from flotilla_server.engine.core import _load as read_model  # the dtype choice and its log, as the core's
    from flotilla_server.engine.loop import build_loop

    start_s = time.perf_counter()
    if loaded is None:
        loaded = read_model(config)
    read_s = time.perf_counter()
    return build_loop(config, options, loaded), read_s - start_s, time.perf_counter() - read_s


def _build(config: EngineConfig, options: EngineOptions, loaded: LoadedModel | None = None) -> tuple[EngineLoop, float, float]:
    import torch

    if options.num_threads is not None:
        torch.set_num_threads(options.num_threads)
    return _read_and_build(config, options, loaded)


def _load(config: EngineConfig, options: EngineOptions) -> tuple[EngineLoop, float, float]:
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
            outcome.append(_read_and_build(config, options, None))
        except BaseException as e:  # raised again on the main thread
            outcome[:] = [e]

    loader = threading.Thread(target=load, name="flotilla-model-load")
    loader.start()
    loader.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    threads, built = outcome
    import torch

    torch.set_num_threads(threads)  # the global count, and OpenMP's for this thread, which runs the steps
    return built


def _warm_up(loop: EngineLoop) -> float:
    """One greedy one-token request through the loop, on the thread and thread count that will run the steps:
    the first real request then pays no first-use costs (allocations, kernel and thread-pool start-up)."""
    from flotilla_server.engine.messages import AddRequest
    from flotilla_server.engine.sampling_params import SamplingParams

    start_s = time.perf_counter()
    loop.apply(AddRequest(WARM_UP_REQUEST_ID, [0], SamplingParams(max_tokens=1, temperature=0.0)))
    while loop.has_work():
        loop.turn(lambda _timeout_s: False)
    return time.perf_counter() - start_s


def _start(config: EngineConfig, options: EngineOptions, warm_up: bool) -> tuple[EngineLoop, LoadPhases]:
    if options.load_nice or options.load_threads:
        loop, read_s, build_s = _load(config, options)
    else:
        loop, read_s, build_s = _build(config, options)
    if options.measure_threads:
        loop.core.measure_threads()
    return loop, LoadPhases(read_s, build_s, _warm_up(loop) if warm_up else 0.0)


def _park(loaded: LoadedModel, device: str, park: Park, conn: Connection) -> bool:
    """With the engine's KV pool released and its loop dropped by the caller, park the weights and say Parked;
    False (EngineFailed said) on failure. The parent waits for Parked (its next load waits for the memory), so
    the loop's other garbage is collected after it (_collect_when_idle)."""
    from flotilla_server.model.parked_weights import (
        park_to_file,
        park_to_host,
        private_anonymous_bytes,
        release_freed_heap,
    )

    try:
        weights = park_to_host(loaded.model) if device.startswith("cuda") else park_to_file(loaded.model, Path(park.path))
    except (OSError, RuntimeError) as e:
        conn.send(EngineFailed(f"parking the weights failed: {e}"))
        return False
    release_freed_heap()
    conn.send(Parked(weights.bytes, private_anonymous_bytes(), weights.path))  # before the collection: an upper bound
    return True


def _collect_when_idle(conn: Connection, parks_uncollected: int) -> int:
    """The closed loops' garbage, once the parked process has been idle PARKED_IDLE_GC_S (a full collection
    takes ~0.1 s, and a Wake coming meanwhile would wait for it), or at once after PARKED_GC_EVERY parks
    without one; returns the parks left uncollected. The loops were frozen at start (freeze_startup_heap):
    their cycles are collected only once unfrozen."""
    from flotilla_server.model.parked_weights import release_freed_heap

    if parks_uncollected < PARKED_GC_EVERY and conn.poll(PARKED_IDLE_GC_S):
        return parks_uncollected  # a message came first: this collection waits for the next park
    gc.unfreeze()
    gc.collect()
    gc.freeze()  # what stays parked is never garbage: the wake's start-up collection need not walk it
    release_freed_heap()
    return 0


def _wake(loaded: LoadedModel, wake: Wake) -> tuple[EngineLoop, LoadPhases]:
    """The engine built again on the parked weights (copied back first on a GPU), then warmed up."""
    import torch

    from flotilla_server.engine.loop import build_loop
    from flotilla_server.model.parked_weights import unpark_from_host

    if wake.options.num_threads is not None:
        torch.set_num_threads(wake.options.num_threads)
    start_s = time.perf_counter()
    if wake.config.device.startswith("cuda"):
        unpark_from_host(loaded.model, wake.config.device)
    read_s = time.perf_counter()
    loop = build_loop(wake.config, wake.options, loaded)
    build_s = time.perf_counter() - read_s
    return loop, LoadPhases(read_s - start_s, build_s, _warm_up(loop))


def run_engine_process(config: EngineConfig, options: EngineOptions, conns: list[Connection],
                       parkable: bool = False) -> None:
    """`conns`: one pipe per HTTP process (engine/front_inbox.py); the first hears whether the engine started.
    `parkable` (a pool's engine, one pipe): warm up before saying ready, and take Park and Wake."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if options.num_threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(options.num_threads)  # read once, when torch loads OpenMP
    exit_with_parent()  # even in the middle of a long step (the loop notices a closed pipe only between steps)
    try:
        loop, phases = _start(config, options, warm_up=parkable)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        conns[0].send(EngineFailed(str(e)))
        sys.exit(1)
    from flotilla_server.engine.loop import serve_inbox
    from flotilla_server.engine.startup_heap import freeze_startup_heap

    freeze_startup_heap()
    conns[0].send(phases)
    conns[0].send(loop.info(os.getpid()))
    if len(conns) == 1:
        inbox: Inbox = PipeInbox(conns[0], parkable)
        send: Callable[[EngineUpdate], None] = conns[0].send
    else:
        from flotilla_server.engine.front_inbox import FrontInbox

        fronts = FrontInbox(conns)
        inbox, send = fronts, fronts.send
    parks_uncollected = 0
    try:
        while True:
            serve_inbox(loop, inbox, send)
            park = getattr(inbox, "park", None)
            if park is None:
                return  # Shutdown
            inbox.park = None
            loaded, device = loop.core.loaded, loop.core.config.device
            loop.core.runner.kv.release()  # the KV pool's memory, now: the loop itself goes with the collection
            del loop  # serve_inbox closed it
            if not _park(loaded, device, park, conns[0]):
                return
            parks_uncollected = _collect_when_idle(conns[0], parks_uncollected + 1)
            wake = conns[0].recv()
            if not isinstance(wake, Wake):
                return  # Shutdown, or parking failed
            try:
                loop, phases = _wake(loaded, wake)
            except (ValueError, FileNotFoundError, RuntimeError) as e:
                conns[0].send(EngineFailed(str(e)))
                sys.exit(1)
            freeze_startup_heap()
            conns[0].send(phases)
            conns[0].send(replace(loop.info(os.getpid()), tokenizer=None))  # the parent kept it: no pickling
    except (EOFError, BrokenPipeError, ConnectionResetError):
        log.info("the HTTP side is gone; the engine process exits")
    except Exception:
        log.exception("engine loop failed; the engine process exits")
        sys.exit(1)
