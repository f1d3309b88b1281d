"""Load shedding at the door: refuse generation requests with 429 (queue full) or 503 (draining) before
anything parses them.

Under a burst, parsing and validating hundreds of bodies that will be refused anyway would delay every
answer, the refusals included; a refusal here costs a few microseconds. A request let through holds a
door ticket until it reaches the queue (or fails validation), so a burst is counted at the door before
any of it is parsed: door tickets plus waiters may not exceed queue depth plus slots. The admission
queue still enforces its own depth exactly.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from flotilla_server.http.errors import error_body
from flotilla_server.http.refusals import (
    DRAINING_HEADERS,
    DRAINING_MESSAGE,
    queue_full_message,
    retry_after_s,
)
from flotilla_server.http.state import ServerState

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


class LoadShedder:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        state, m = self.state, self.state.metrics
        if state.draining:
            m.count_request(503)
            m.count_rejection("draining")
            await _answer(send, 503, error_body(503, DRAINING_MESSAGE, code="draining"),
                          [(k.lower().encode(), v.encode()) for k, v in DRAINING_HEADERS.items()])
            return
        if state.admission.is_full() or len(state.admission) + state.at_door >= state.door_limit:
            retry_s = retry_after_s(state.admission.queue_timeout_s)
            m.count_request(429)
            m.count_rejection("queue_full")
            await _answer(send, 429, error_body(429, queue_full_message(state.admission.depth, retry_s),
                                                code="queue_full"), [(b"retry-after", str(retry_s).encode())])
            return
        ticket = DoorTicket(state)
        scope[DOOR_TICKET] = ticket
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.release()


DOOR_TICKET = "flotilla.door_ticket"


class DoorTicket:
    """A place between the door and the queue; released once, when the request is queued or refused."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._held = True
        state.at_door += 1

    def release(self) -> None:
        if self._held:
            self._held = False
            self._state.at_door -= 1


async def _answer(send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})
