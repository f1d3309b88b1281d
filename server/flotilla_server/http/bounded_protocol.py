"""uvicorn's HTTP protocol with bounded per-connection send buffers.

Backpressure only works if a stalled client stalls its handler soon: by default the kernel may grow a
connection's send buffer to megabytes (tcp_wmem autotuning), so a reader that stopped could absorb
thousands of tokens before its request's bounded event buffer fills and it is cut off as slow_client.
Fixing SO_SNDBUF and the transport's high-water mark bounds what one stalled client can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol

SEND_BUFFER_BYTES = 64 * 1024  # the kernel doubles it for bookkeeping
TRANSPORT_HIGH_WATER_BYTES = 64 * 1024


class BoundedH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        transport.set_write_buffer_limits(high=TRANSPORT_HIGH_WATER_BYTES)
        super().connection_made(transport)
