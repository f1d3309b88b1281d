"""Streams that keep every slot's engine work going while a burst lands, for `flotilla-bench modes`.

Why: the burst scenario starts from an idle engine, and the door answers a burst's refusals before the
requests it lets in reach the engine (docs/benchmarks.md, "Engine modes"), so in neither mode does the
engine step while the refusals are written. A burst that lands while every slot streams is where the engine
and the HTTP side contend: for the GIL when the engine is a thread of the HTTP process, for the cores when it
is a process of its own. The streams are read in a process of their own, so that neither the burst's client
nor the server waits on them; leaving the block closes them, and the server aborts them as it does for any
client that leaves.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import selectors
import socket
import time
import urllib.request
from typing import Any

from flotilla_contract.load import LOAD_PATH

START_TIMEOUT_S = 60.0
IDLE_TIMEOUT_S = 60.0


def _stream(port: int, request: bytes, streams: int, streaming: Any, stop: Any, failed: Any) -> None:
    """Opens `streams` streams; sets `streaming` once each has its first token, reads them until `stop`."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
    for sock in socks:
        sock.sendall(request)
    tokens_seen: set[socket.socket] = set()
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while not stop.is_set():
            for key, _ in selector.select(0.05):
                data = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
                if not data:  # a stream that ends before the burst is done leaves a slot free
                    failed.set()
                    selector.unregister(key.fileobj)
                elif b'"text"' in data:
                    tokens_seen.add(key.fileobj)  # type: ignore[arg-type]
                    if len(tokens_seen) == streams:
                        streaming.set()
    for sock in socks:
        sock.close()


class BusyStreams:
    """`with BusyStreams(port, streams, request):` holds `streams` streams of `request` (a streamed POST),
    each past its first token, until the block ends; `ended_early` says whether any ended before that."""

    def __init__(self, port: int, streams: int, request: bytes) -> None:
        ctx = mp.get_context("spawn")
        self._streaming, self._stop, self._failed = ctx.Event(), ctx.Event(), ctx.Event()
        self._process = ctx.Process(target=_stream, daemon=True,
                                    args=(port, request, streams, self._streaming, self._stop, self._failed))
        self.ended_early = False

    def __enter__(self) -> BusyStreams:
        self._process.start()
        if not self._streaming.wait(START_TIMEOUT_S):
            self._stop.set()
            self._process.join(10)
            raise RuntimeError(f"the busy streams had no first token within {START_TIMEOUT_S:.0f} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self.ended_early = self._failed.is_set()


def load(port: int) -> dict:
    """The server's load report (flotilla_contract.load.ServerLoad as JSON)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{LOAD_PATH}", timeout=5) as answer:
        return json.load(answer)


def wait_idle(port: int) -> None:
    """Until the server's load report shows nothing running and nothing waiting."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        report = load(port)
        if report["running"] == 0 and report["waiting"] == 0:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the server was still busy {IDLE_TIMEOUT_S:.0f} s after the busy streams closed")
