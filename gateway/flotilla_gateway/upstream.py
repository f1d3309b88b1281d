"""The proxy's HTTP/1.1 client to the pods: a request out, the answer's bytes back as they arrive, at the least
CPU per chunk (docs/benchmarks.md, "Gateway overhead": aiohttp's stream reader cost more per chunk than the
rest of the relay together).

Rules:
- one connection carries one request at a time; a connection whose answer ended cleanly (and that the pod
  keeps alive) goes back to its pod's idle list for up to IDLE_S, less than the servers' own keep-alive, so a
  pod never closes one just as it is reused; any other ends closed;
- a failure before the status line raises ConnectFailed (refused, reset, timed out, closed), after it Dropped
  (the connection ended before the answer did): both are ConnectionErrors;
- reading stops (the transport pauses) while more than HIGH_WATER_BYTES wait for a slow client.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import httptools

IDLE_S = 4.0  # below uvicorn's default keep-alive (5 s), which flotilla-server keeps
HIGH_WATER_BYTES = 256 * 1024
MAX_IDLE_PER_POD = 256


class ConnectFailed(ConnectionError):
    """No status line came: the pod refused, reset or closed the connection, or did not connect in time."""


class Dropped(ConnectionError):
    """The connection ended after the status line, before the answer's end."""


class Answer(asyncio.Protocol):
    """One connection to a pod and the answer now on it: `status`, `headers` (lower-case names), then `read()`
    until b"" (the end)."""

    def __init__(self, address: str, on_clean_end: Callable[[Answer], None]) -> None:
        self.address = address
        self.on_clean_end = on_clean_end  # the connection may carry another request
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._head_done = False
        self._complete = False
        self._framed = False  # chunked or Content-Length: the end is not the connection's
        self._error: ConnectionError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.idle_since = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the pod switched protocols")
        except httptools.HttpParserError as error:
            self._fail(f"the pod's answer is not HTTP/1.1 ({error})")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_done and not self._complete and not self._framed and self._error is None:
            self._complete = True  # an answer delimited by the connection's end
        elif not self._complete:
            self._error = self._error or self._lost(f"the connection ended ({exc or 'closed by the pod'})")
        self.transport = None
        self._wake()

    # -- httptools callbacks -------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        if key in ("content-length", "transfer-encoding"):
            self._framed = True
        self.headers.append((key, value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer: the real one follows
            self.headers = []
            self._framed = False
            return
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:  # once per chunk: kept lean
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        if not self._head_done:
            return
        self._complete = True
        self._wake()

    # -- the answer ----------------------------------------------------------------------------------------

    def header(self, name: str, default: str = "") -> str:
        return next((v for k, v in self.headers if k == name), default)

    async def read(self) -> bytes:
        """The bytes that arrived since the last read (waiting for some); b"" once the answer ended; Dropped
        when the connection ended first."""
        while not self._body:
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            assert self._loop is not None
            self._waiter = self._loop.create_future()
            await self._waiter
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def head(self) -> None:
        while not self._head_done:
            if self._error is not None:
                raise ConnectFailed(str(self._error))
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def close(self) -> None:
        """Done with the answer: its connection goes back to the pod's idle list when it ended cleanly and kept
        alive, else it is closed (a pod then sees the client leave)."""
        transport, self.transport = self.transport, None
        if transport is None:
            return
        if self._complete and not self._body and self._error is None and self._parser.should_keep_alive():
            self.transport = transport
            self.on_clean_end(self)
        else:
            transport.close()

    def reuse(self) -> None:
        self.status, self.headers = 0, []
        self._parser = httptools.HttpResponseParser(self)
        self._head_done = self._complete = self._framed = False
        self._buffered = 0

    def _fail(self, reason: str) -> None:
        self._error = self._lost(reason)
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _lost(self, reason: str) -> ConnectionError:
        return Dropped(f"{self.address}: {reason}") if self._head_done else ConnectFailed(f"{self.address}: {reason}")

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class UpstreamClient:
    """Connections to the pods, kept alive between requests (IDLE_S)."""

    def __init__(self, connect_timeout_s: float = 5.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle: dict[str, deque[Answer]] = {}

    async def post(self, address: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        """The pod's answer once its status line and headers came (its body unread); ConnectFailed otherwise.
        A kept-alive connection that the pod closed as it was reused (no status line came) is not the pod's
        failure: the request goes once more, on a new connection, as browsers and aiohttp do."""
        reused = self._idle(address)
        if reused is not None:
            try:
                return await self._send(reused, address, path, body, headers)
            except ConnectFailed:
                pass
        return await self._send(await self._connect(address), address, path, body, headers)

    @staticmethod
    async def _send(answer: Answer, address: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        head = [f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {len(body)}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
        head.append("\r\n")
        try:
            assert answer.transport is not None
            answer.transport.write("".join(head).encode("utf-8") + body)
            await answer.head()
        except BaseException:
            answer._complete = False
            answer.close()  # cancelled or failed: the pod must see the connection end
            raise
        return answer

    def _idle(self, address: str) -> Answer | None:
        idle = self.idle.get(address)
        now = time.monotonic()
        while idle:
            answer = idle.pop()
            if answer.transport is not None and not answer.transport.is_closing() and now - answer.idle_since < IDLE_S:
                answer.reuse()
                return answer
            if answer.transport is not None:
                answer.transport.close()
        return None

    async def _connect(self, address: str) -> Answer:
        host, _, port = address.rpartition(":")
        answer = Answer(address, self._release)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: answer, host.strip("[]"), int(port)), self.connect_timeout_s)
        except (OSError, TimeoutError) as error:
            raise ConnectFailed(f"{address}: {error or type(error).__name__}") from error
        return answer

    def _release(self, answer: Answer) -> None:
        idle = self.idle.setdefault(answer.address, deque())
        if len(idle) >= MAX_IDLE_PER_POD:
            if answer.transport is not None:
                answer.transport.close()
            return
        answer.idle_since = time.monotonic()
        idle.append(answer)

    def close(self) -> None:
        for idle in self.idle.values():
            for answer in idle:
                if answer.transport is not None:
                    answer.transport.close()
        self.idle.clear()
