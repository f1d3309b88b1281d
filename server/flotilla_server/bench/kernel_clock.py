"""Request latencies timed by the kernel, for `flotilla-bench modes`: from just before a request is written
to the arrival of its answer's first bytes, as the kernel stamped them (SO_TIMESTAMPNS).

Why: the asyncio client this benchmark used before 2026-12-04 opened each connection just before writing
on it and timed each answer when its own event loop got round to reading it. On one server, interleaved
with this client, it measured the burst's 429 p95 at 8.6-21 ms where this client measures 26-56 ms
(docs/benchmarks.md, "Engine modes"). Here every connection is open before the first request is written,
the requests are written within about 2 ms, and each answer is timed by the kernel's stamp on its arrival,
whatever the client is doing then. The send time is read just before the write, so a client delayed there
makes the server look slower, never faster.

- `burst`: every connection opened first, then every request written, then every answer read: the
  requests arrive together, as from clients that keep connections open (a gateway's pool);
- `HealthPoller`: GET /healthz every POLL_INTERVAL_S from a process of its own, so that the burst's
  client and the poller do not wait for each other.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; the constant is missing from Python's socket
POLL_INTERVAL_S = 0.02
READ_TIMEOUT_S = 120.0
UNANSWERED = 0


@dataclass(frozen=True)
class Answer:
    status: int  # UNANSWERED: the server closed the connection without a byte
    latency_s: float  # request about to be written → its answer's first bytes arrived (kernel time)
    error_code: str  # the error body's "code", if any


def _stamped_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return sock


def _arrival_ns(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive stamp (CLOCK_REALTIME, as time.time_ns), or now if the data carries none.

    Linux switches its receive stamps on for the first socket that asks from a work queue, so data received
    meanwhile carries none, and TCP then passes no stamp at all: a poller whose connections are all closed
    between probes meets it now and then. Such data is timed when read, which is later than its arrival:
    the server looks slower, never faster."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return seconds * 10**9 + nanoseconds
    return time.time_ns()


def post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))


def burst(port: int, request: bytes, n: int) -> list[Answer]:
    """`n` copies of `request` at once, each on its own connection; read to the end of every answer."""
    socks = [_stamped_socket(port) for _ in range(n)]
    sent_ns: dict[socket.socket, int] = {}
    for sock in socks:
        sent_ns[sock] = time.time_ns()
        sock.sendall(request)
    first_ns: dict[socket.socket, int] = {}
    data = {sock: bytearray() for sock in socks}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        open_socks = len(socks)
        while open_socks:
            ready = selector.select(READ_TIMEOUT_S)
            if not ready:
                raise TimeoutError(f"{open_socks} answers not complete after {READ_TIMEOUT_S} s")
            for key, _ in ready:
                sock = key.fileobj
                chunk, ancillary, _, _ = sock.recvmsg(1 << 16, 256)  # type: ignore[union-attr]
                if chunk:
                    if sock not in first_ns:
                        first_ns[sock] = _arrival_ns(ancillary)  # type: ignore[index]
                    data[sock] += chunk  # type: ignore[index]
                else:
                    selector.unregister(sock)
                    sock.close()  # type: ignore[union-attr]
                    open_socks -= 1
    return [_answer(bytes(data[s]), (first_ns[s] - sent_ns[s]) / 1e9) if s in first_ns
            else Answer(UNANSWERED, float("nan"), "") for s in socks]


def _answer(raw: bytes, latency_s: float) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    code = ""
    if status >= 400:
        start = body.find(b"{")  # the JSON body, possibly inside one chunk of chunked encoding
        if start >= 0:
            code = json.JSONDecoder().raw_decode(body[start:].decode())[0].get("error", {}).get("code", "")
    return Answer(status, latency_s, code)


class NoAnswer(ConnectionError):
    """The server closed the connection without answering."""


def probe(port: int, path: str = "/healthz") -> float:
    """Seconds from just before a GET is written to its answer's arrival; NoAnswer if the server closes the
    connection first."""
    with _stamped_socket(port) as sock:
        sent = time.time_ns()
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        first, ancillary, _, _ = sock.recvmsg(1 << 16, 256)
        if not first:
            raise NoAnswer(f"GET {path}: the server closed the connection without an answer")
        arrived = _arrival_ns(ancillary)
        while sock.recv(1 << 16):
            pass
    return (arrived - sent) / 1e9


def _poll(port: int, started: Any, stop: Any, out: Any) -> None:  # multiprocessing's Events and Queue
    latencies, unanswered = [], 0
    while not stop.is_set():
        try:
            latencies.append(probe(port))
        except ConnectionError:  # reported beside the latencies, never folded into them
            unanswered += 1
        started.set()
        stop.wait(POLL_INTERVAL_S)
    out.put((latencies, unanswered))


class HealthPoller:
    """`with HealthPoller(port) as poller:` polls /healthz until the block ends; then `poller.latencies_s`, and
    `poller.unanswered`: the polls whose connection was closed or reset before an answer."""

    def __init__(self, port: int) -> None:
        ctx = mp.get_context("spawn")
        self._started, self._stop, self._out = ctx.Event(), ctx.Event(), ctx.Queue()
        self._process = ctx.Process(target=_poll, args=(port, self._started, self._stop, self._out), daemon=True)
        self.latencies_s: list[float] = []
        self.unanswered = 0

    def __enter__(self) -> HealthPoller:
        self._process.start()
        if not self._started.wait(30):
            self._process.kill()
            raise RuntimeError("the /healthz poller did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.latencies_s, self.unanswered = self._out.get(timeout=30)
        self._process.join(10)
        if not self.latencies_s:
            raise RuntimeError("the /healthz poller measured nothing")
