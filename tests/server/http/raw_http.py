"""A minimal HTTP/1.1 client over asyncio streams, for timing what httpx would hide.

Connect first, send later: the time to a response is measured from the moment the request's bytes
were written, not including connection set-up or client-side scheduling of 200 coroutines.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    status_after_s: float  # request written → status line read
    body: bytes = b""
    events: list[dict] = field(default_factory=list)  # parsed SSE data events (not [DONE])
    event_times_s: list[float] = field(default_factory=list)  # monotonic arrival of each event
    done: bool = False  # saw data: [DONE]


def request_bytes(host: str, port: int, path: str, body: dict | bytes, method: str = "POST",
                  extra_headers: dict[str, str] | None = None) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Host": f"{host}:{port}", "Content-Type": "application/json", "Content-Length": str(len(raw)),
               "Connection": "close", **(extra_headers or {})}
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode() + raw


async def connect(host: str, port: int, rcvbuf: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if rcvbuf is None:
        return await asyncio.open_connection(host, port)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: it sets the TCP window
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    return await asyncio.open_connection(sock=sock, limit=2**16)


async def read_head(reader: asyncio.StreamReader, sent_at: float) -> RawResponse:
    status_line = await reader.readline()
    status_after = time.monotonic() - sent_at
    if not status_line:
        raise ConnectionError("connection closed before a status line")
    status = int(status_line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    return RawResponse(status, headers, status_after)


async def read_rest(reader: asyncio.StreamReader, resp: RawResponse) -> RawResponse:
    """Read the body; for text/event-stream parse events as they arrive (chunked encoding)."""
    if "text/event-stream" not in resp.headers.get("content-type", ""):
        resp.body = await reader.read()
        return resp
    buf = b""
    while True:
        size_line = await reader.readline()
        if not size_line:
            return resp
        size = int(size_line.strip() or b"0", 16)
        if size == 0:
            return resp
        buf += await reader.readexactly(size)
        await reader.readexactly(2)
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.decode().removeprefix("data: ")
            if data == "[DONE]":
                resp.done = True
            else:
                resp.events.append(json.loads(data))
                resp.event_times_s.append(time.monotonic())


async def post(host: str, port: int, path: str, body: dict | bytes, **kw) -> RawResponse:
    reader, writer = await connect(host, port)
    try:
        writer.write(request_bytes(host, port, path, body, **kw))
        sent = time.monotonic()
        await writer.drain()
        return await read_rest(reader, await read_head(reader, sent))
    finally:
        writer.close()
