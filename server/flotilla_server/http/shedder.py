"""Load shedding at the door, as ASGI middleware: refuse generation requests with 429 (queue full, tenant
limit) or 503 (draining) before anything parses their bodies (the rule: http/door.py).

Under a burst, parsing and validating hundreds of bodies that will be refused anyway would delay every
answer, the refusals included. A single-model server applies the rule earlier still, in its HTTP protocol
(http/door_protocol.py), and hands this middleware a request it let in with its ticket; this middleware
decides the rest (a pipelined request, a server started without that protocol, as the tests' in-process
apps are). Every request let in, by either, waits here for a quiet door before the app parses it
(http/door_traffic.py).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from flotilla_server.http.door import DOOR_TICKET, GENERATION_PATHS, DoorTicket, refusal_at_door
from flotilla_server.http.state import ServerState


class LoadShedder:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        ticket = scope.get(DOOR_TICKET)
        if ticket is None:
            refusal = refusal_at_door(self.state, scope["headers"])
            if refusal is not None:
                await answer(send, refusal.status, refusal.body, refusal.headers)
                return
            ticket = scope[DOOR_TICKET] = DoorTicket(self.state)
        try:
            await self.state.door_traffic.until_quiet()  # the burst's refusals first (http/door_traffic.py)
            await self.app(scope, receive, send)
        finally:
            ticket.release()


async def answer(send: Send, status: int, payload: bytes, headers: tuple[tuple[bytes, bytes], ...]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})
