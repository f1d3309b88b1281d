"""uvicorn's HTTP protocol (httptools, on uvloop) with bounded per-connection send buffers.

Backpressure only works if a stalled client stalls its handler soon: by default the kernel may grow a
connection's send buffer to megabytes (tcp_wmem autotuning), so a reader that stopped could absorb
thousands of tokens before its request's bounded event buffer fills and it is cut off as slow_client.
Fixing SO_SNDBUF and the transport's high-water mark bounds what one stalled client can hold.

The parser is httptools (llhttp, in C) and the loop uvloop: under a burst the HTTP process parses every
request before the door can refuse it, and h11's pure-Python parser on asyncio's loop took 2.5x as long
per refusal (docs/benchmarks.md, "Engine modes").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

SEND_BUFFER_BYTES = 64 * 1024  # the kernel doubles it for bookkeeping
TRANSPORT_HIGH_WATER_BYTES = 64 * 1024
EVENT_LOOP = "uvloop"  # uvicorn's `loop` setting, beside `http=BoundedHttpProtocol`


class BoundedHttpProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        transport.set_write_buffer_limits(high=TRANSPORT_HIGH_WATER_BYTES)
        super().connection_made(transport)
