"""Load shedding at the door: refuse generation requests with 429 (queue full) or 503 (draining) before
anything parses them.

Under a burst, parsing and validating hundreds of bodies that will be refused anyway would delay every
answer, the refusals included; a refusal here costs a few microseconds. A request let through holds a
door ticket until it reaches the queue (or fails validation), so a burst is counted at the door before
any of it is parsed: door tickets plus waiters may not exceed queue depth plus slots. The admission
queue still enforces its own depth exactly.

The class and tenant headers are read here too (docs/serving.md, "Priorities and tenants"): a request
marked batch while batch work holds its share of the queue, or from a tenant with `--tenant-max-queued`
requests waiting, is refused before its body is read, so that one tenant's flood of refusals costs the
others as little as it can. A tenant named only in the body (`user`) is checked at admission.
"""

from __future__ import annotations

import json

from flotilla_contract.classes import BATCH, DEFAULT_REQUEST_CLASS, TENANT_LIMIT
from flotilla_contract.labels import CLASS_HEADER, TENANT_HEADER
from starlette.types import ASGIApp, Receive, Scope, Send

from flotilla_server.http.errors import error_body
from flotilla_server.http.refusals import (
    DRAINING_HEADERS,
    DRAINING_MESSAGE,
    queue_full_message,
    retry_after_s,
    tenant_limit_message,
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
        queue = state.admission
        request_class, tenant = _header(scope, _CLASS), _header(scope, _TENANT)
        batch = request_class is not None and request_class.strip().lower() == BATCH
        reason = None
        if queue.is_full() or len(queue) + state.at_door >= state.door_limit or (batch and queue.batch_is_full()):
            reason = "queue_full"
        elif tenant is not None and queue.tenant_is_full(tenant):
            reason = TENANT_LIMIT
        if reason is not None:
            retry_s = retry_after_s(queue.timeout_s(BATCH if batch else DEFAULT_REQUEST_CLASS))
            m.count_request(429)
            m.count_rejection(reason)
            m.classes.count_refusal(BATCH if batch else DEFAULT_REQUEST_CLASS, tenant or "", reason)
            message = (queue_full_message(queue.depth, retry_s) if reason == "queue_full"
                       else tenant_limit_message(tenant or "", queue.tenant_max_queued or 0, retry_s))
            await _answer(send, 429, error_body(429, message, code=reason), [(b"retry-after", str(retry_s).encode())])
            return
        ticket = DoorTicket(state)
        scope[DOOR_TICKET] = ticket
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.release()


DOOR_TICKET = "flotilla.door_ticket"
_CLASS, _TENANT = CLASS_HEADER.lower().encode(), TENANT_HEADER.lower().encode()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


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
