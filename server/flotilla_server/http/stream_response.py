"""The HTTP side of a stream: a response whose clean-up always runs, and the client's disconnect as an await."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from flotilla_server.http.reply import SSE_HEADERS


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has closed its connection (the request body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class GuardedStream(StreamingResponse):
    """An SSE StreamingResponse whose clean-up runs even if the body iterator never started."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
