"""An ASGI middleware that refuses bad request bodies before any handler parses them.

Bodies over ``max_body_bytes`` get 413 (checked on Content-Length and again while reading, for chunked
uploads); bodies of POST requests that are not UTF-8 JSON objects get 400 with a message that says what
to send. Accepted bodies are replayed unchanged to the application.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from flotilla_contract.flags import DEFAULT_MAX_BODY_BYTES
from flotilla_contract.request_body import body_problem, too_large_message
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flotilla_server.http.errors import error_body

_DISCARD_FACTOR = 16  # beyond this many limits of excess, stop reading and just answer


class BodyGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 on_refuse: Callable[[int], None] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.on_refuse = on_refuse  # told the status of every refusal (metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._discard(receive)
            await self._refuse(send, 413, too_large_message(self.max_body_bytes))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                if message.get("more_body", False):
                    await self._discard(receive)
                await self._refuse(send, 413, too_large_message(self.max_body_bytes))
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        problem = body_problem(raw)
        if problem is not None:
            await self._refuse(send, 400, problem)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _discard(self, receive: Receive) -> None:
        """Read and drop the rest of an oversized body (up to a bound), so the client reads a clean 413
        instead of a connection reset."""
        dropped = 0
        while dropped <= _DISCARD_FACTOR * self.max_body_bytes:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                return
            dropped += len(message.get("body", b""))

    async def _refuse(self, send: Send, status: int, message: str) -> None:
        if self.on_refuse is not None:
            self.on_refuse(status)
        payload = json.dumps(error_body(status, message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
