"""The door in the HTTP protocol: a single-model server refuses a generation request as soon as its headers
are parsed, before uvicorn creates a task for it and before the ASGI middleware stack runs.

Why: under a burst, every refusal went through uvicorn's request cycle, a task, and FastAPI's and
Starlette's middleware layers before the load shedder answered it, and that path, not the engine, set the
refusals' latency: 200 requests against 4 slots took ~25 ms to the 95th-percentile 429 in either engine mode
(docs/benchmarks.md, "Engine modes"). Here a refusal is one write of prepared bytes.

Rules:
- only a POST to a generation path, on a connection with no response in progress (a pipelined request is
  left to the ASGI shedder, which applies the same rule: http/door.py);
- with `--api-key`, only a request that carries the key: any other is left to the ASGI key guard, which
  answers 401 first, so that no one without the key learns the load;
- a refusal closes the connection (`Connection: close`): the rest of its body is never read, and a client
  that retries reconnects;
- a request let in carries its DoorTicket in the ASGI scope; the shedder releases it when the request has
  been queued or answered.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

import httptools

from flotilla_server.http.bounded_protocol import BoundedHttpProtocol
from flotilla_server.http.door import DOOR_TICKET, GENERATION_PATHS, DoorTicket, refusal_at_door
from flotilla_server.http.state import ServerState

_RAW_GENERATION_PATHS = frozenset(p.encode() for p in GENERATION_PATHS)
_REASONS = {429: b"Too Many Requests", 503: b"Service Unavailable"}


class _Answered:
    """The request cycle of a request refused here: complete, so the parser's later callbacks (the body it
    still holds) and connection_lost leave it alone."""

    response_complete = True

    class message_event:
        @staticmethod
        def set() -> None:
            pass


_ANSWERED: Any = _Answered()


class DoorHttpProtocol(BoundedHttpProtocol):
    def __init__(self, *args: Any, door: ServerState, api_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._door = door
        self._expected_authorization = f"Bearer {api_key}".encode() if api_key else None

    def on_headers_complete(self) -> None:
        if not self._at_door():
            super().on_headers_complete()
            return
        refusal = refusal_at_door(self._door, self.headers)
        if refusal is None:
            self.scope[DOOR_TICKET] = DoorTicket(self._door)  # type: ignore[typeddict-unknown-key]
            super().on_headers_complete()
            return
        head = [b"HTTP/1.1 %d %s\r\n" % (refusal.status, _REASONS[refusal.status])]
        for name, value in (*self.server_state.default_headers, (b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(refusal.body)), *refusal.headers):
            if name != b"connection":
                head.append(b"%s: %s\r\n" % (name, value))
        self.transport.write(b"".join(head) + b"connection: close\r\n\r\n" + refusal.body)
        self.transport.close()
        self.cycle = _ANSWERED

    def _at_door(self) -> bool:
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # pipelined behind a response in progress
        if self.parser.get_method() != b"POST" or httptools.parse_url(self.url).path not in _RAW_GENERATION_PATHS:
            return False
        if self._expected_authorization is None:
            return True
        sent = next((v for k, v in self.headers if k == b"authorization"), b"")
        return hmac.compare_digest(sent, self._expected_authorization)


def door_protocol(state: ServerState, api_key: str | None) -> Any:
    """uvicorn's `http` setting for a single-model server: the protocol class with this server's door."""

    def make(*args: Any, **kwargs: Any) -> asyncio.Protocol:
        return DoorHttpProtocol(*args, door=state, api_key=api_key, **kwargs)

    return make
