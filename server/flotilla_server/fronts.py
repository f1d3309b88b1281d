"""Several HTTP processes over one engine process (`--http-processes N`): a parent that starts and watches
them, and each one's entry point.

Why: with the engine in its own process, the HTTP side no longer shares its interpreter, so it can scale
out as vLLM's API servers do. N processes share the port (SO_REUSEPORT: the kernel spreads connections
over their sockets), split a burst's parsing and refusals and a stream load's SSE encoding across cores,
and each talks to the engine over its own pipe (engine/front_inbox.py). The in-process mode cannot.

The parent (the process a pod's SIGTERM reaches):
- starts the engine with N pipes, binds N listening sockets, then spawns the N HTTP processes, handing
  each its socket, its pipe and its share of the queue (http/front_share.py), and closes its own copies;
- forwards every SIGINT and SIGTERM to them as SIGTERM, so that they drain (first), cut off (second) and
  exit at once (third) as one server does (http/serve.py); they ignore the SIGINT a terminal sends the
  whole process group, so that Ctrl-C counts once;
- points prometheus_client at one directory for them all (PROMETHEUS_MULTIPROC_DIR), so that any
  process's /metrics shows every process's counters; the gauges come from the engine's shared stats;
- exits 0 once every HTTP process drained and exited 0; if one exits otherwise (the engine died: each of
  them saw its pipe close and answered as one server does), it stops the others and exits 1, so that
  Kubernetes restarts the pod.

Each HTTP process, and the engine, exits with its parent (engine/parent_watch.py): a SIGKILLed parent
leaves no orphan holding the port or memory.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any

from flotilla_server.engine.backends import EngineProcess
from flotilla_server.engine.factory import connect_engine
from flotilla_server.engine.messages import EngineInfo
from flotilla_server.engine.parent_watch import exit_with_parent
from flotilla_server.http.front_share import FrontShare
from flotilla_server.http.metrics import MULTIPROCESS_DIR_ENV
from flotilla_server.http.serve import configure_logging, serve, served_model, serving_message
from flotilla_server.http.settings import ServerSettings

log = logging.getLogger("flotilla.server")

LISTEN_BACKLOG = 2048  # uvicorn's
_STRAGGLER_S = 5.0  # once one HTTP process failed: how long the others get to finish before they are killed


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound and listening on host:port that other such sockets may share (SO_REUSEPORT)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(LISTEN_BACKLOG)
    return sock


def run_front(settings: ServerSettings, share: FrontShare, conn: Connection, info: EngineInfo,
              sock: socket.socket) -> None:
    """One HTTP process: serve on `sock` over the engine at the end of `conn` (a spawn target)."""
    exit_with_parent()
    configure_logging(settings)
    engine = connect_engine(conn, info)
    engine.start()
    sys.exit(serve(settings, engine, served_model(settings, info), share=share, sock=sock))


class Fronts:
    """The parent's view of the HTTP processes: signals forwarded, exits watched."""

    def __init__(self, processes: list[Any]) -> None:
        self.processes = processes
        self.failed = False
        self._signals = 0
        self._passed_on: dict[int, int] = {}  # by pid: signals passed on

    def forward(self, sig: int, frame: FrameType | None) -> None:
        log.info("%s: passed on to %d HTTP process(es)", signal.Signals(sig).name, len(self.live()))
        self._signals += 1
        self.catch_up()

    def catch_up(self) -> None:
        """Pass every signal received so far to each live process, once: one started after a signal gets it."""
        for p in self.live():
            while self._passed_on.get(p.pid, 0) < self._signals:
                self._passed_on[p.pid] = self._passed_on.get(p.pid, 0) + 1
                os.kill(p.pid, signal.SIGTERM)

    def live(self) -> list[Any]:
        return [p for p in self.processes if p.pid is not None and p.exitcode is None]

    def watch(self) -> None:
        """Until every HTTP process has exited; after the first failure, the others get _STRAGGLER_S."""
        kill_at_s: float | None = None
        # Failures are checked before each wait, not after: live() reaps an exited process, so one that failed
        # before a turn is seen only in its exit code, never by wait(). Signals go to a fresh live(): only this
        # process reaps, so a pid it has not reaped since is still its child's, if only as a zombie.
        while live := self.live():
            bad = [p for p in self.processes if p.exitcode not in (None, 0)]
            if bad and not self.failed:
                self.failed = True
                kill_at_s = time.monotonic() + _STRAGGLER_S
                log.error("HTTP process %s exited with code %s: stopping the others; exiting 1",
                          bad[0].pid, bad[0].exitcode)
                for p in self.live():
                    os.kill(p.pid, signal.SIGTERM)
                    os.kill(p.pid, signal.SIGTERM)  # the second cuts off what is in flight
            elif kill_at_s is not None and time.monotonic() >= kill_at_s:
                for p in self.live():
                    p.kill()
                    p.join(5.0)
            else:
                left_s = None if kill_at_s is None else max(0.0, kill_at_s - time.monotonic())
                wait([p.sentinel for p in live], timeout=left_s)


def serve_fronts(settings: ServerSettings, engine: EngineProcess) -> int:
    """Serve through settings.http_processes HTTP processes until they drained (0) or one failed (1)."""
    count = settings.http_processes
    sockets = [listening_socket(settings.host, settings.port) for _ in range(count)]
    metrics_dir = tempfile.mkdtemp(prefix="flotilla-metrics-")
    os.environ[MULTIPROCESS_DIR_ENV] = metrics_dir  # inherited by the HTTP processes (the engine already runs)
    ctx = mp.get_context("spawn")
    processes = [ctx.Process(target=run_front, name=f"flotilla-http[{i}]",
                             args=(settings, FrontShare(i, count), engine.conns[i], engine.info, sockets[i]))
                 for i in range(count)]
    fronts = Fronts(processes)
    previous = {s: signal.signal(s, fronts.forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in processes:
            p.start()
        fronts.catch_up()  # a signal that came while they started
        for held in (*sockets, *engine.conns):
            held.close()  # theirs now: the engine sees EOF when they are gone, not when this process is
        print(serving_message(settings, settings.served_model_name or engine.info.name)
              + f"\nflotilla-server: {count} HTTP processes ({', '.join(str(p.pid) for p in processes)}) "
              f"over the engine in process {engine.info.pid}", flush=True)
        fronts.watch()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for p in fronts.live():
            p.kill()
            p.join(5.0)
        engine.stop(10.0)  # every pipe is closed: it exits on its own
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.environ.pop(MULTIPROCESS_DIR_ENV, None)
    codes = [p.exitcode for p in processes]
    if fronts.failed or any(codes):
        log.error("an HTTP process exited with %s: exiting 1 so that the server is restarted", codes)
        return 1
    return 0
