"""The door's decision: refuse a generation request from its headers alone (503 draining, 429 queue full or
tenant limit), or let it in with a door ticket.

One rule, applied in two places: the HTTP protocol applies it as soon as a request's headers are parsed
(http/door_protocol.py), before any task or middleware exists for it; the ASGI load shedder applies it to the
requests the protocol leaves to it (http/shedder.py). A request let through holds a door ticket until it
reaches the queue (or fails validation), so a burst is counted at the door before any of it is parsed:
door tickets plus waiters may not exceed queue depth plus slots. The admission queue still enforces its own
depth exactly.

The class and tenant headers are read here too (docs/serving.md, "Priorities and tenants"): a request
marked batch while batch work holds its share of the queue, or from a tenant with `--tenant-max-queued`
requests waiting, is refused before its body is read, so that one tenant's flood of refusals costs the
others as little as it can. A tenant named only in the body (`user`) is checked at admission.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from flotilla_contract.classes import BATCH, DEFAULT_REQUEST_CLASS, TENANT_LIMIT
from flotilla_contract.labels import CLASS_HEADER, TENANT_HEADER

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
DOOR_TICKET = "flotilla.door_ticket"  # the ASGI scope key of a request's ticket
_CLASS, _TENANT = CLASS_HEADER.lower().encode(), TENANT_HEADER.lower().encode()


@dataclass(frozen=True)
class Refusal:
    status: int
    body: bytes  # the JSON error body
    headers: tuple[tuple[bytes, bytes], ...]  # beyond content-type and content-length


def _json(body: dict) -> bytes:
    return json.dumps(body).encode()


DRAINING = Refusal(503, _json(error_body(503, DRAINING_MESSAGE, code="draining")),
                   tuple((k.lower().encode(), v.encode()) for k, v in DRAINING_HEADERS.items()))


def refusal_at_door(state: ServerState, headers: Iterable[tuple[bytes, bytes]]) -> Refusal | None:
    """The answer to a generation request with these (lower-case) headers, counted in the metrics; None: let
    it in (the caller then issues a DoorTicket before yielding to the event loop)."""
    state.door_traffic.arrived()
    m = state.metrics
    if state.draining:
        m.count_request(503)
        m.count_rejection("draining")
        return DRAINING
    request_class, tenant = _header(headers, _CLASS), _header(headers, _TENANT)
    batch = request_class is not None and request_class.strip().lower() == BATCH
    queue = state.admission
    reason = None
    if queue.is_full() or len(queue) + state.at_door >= state.door_limit or (batch and queue.batch_is_full()):
        reason = "queue_full"
    elif tenant is not None and queue.tenant_is_full(tenant):
        reason = TENANT_LIMIT
    if reason is None:
        return None
    retry_s = retry_after_s(queue.timeout_s(BATCH if batch else DEFAULT_REQUEST_CLASS))
    m.count_request(429)
    m.count_rejection(reason)
    m.classes.count_refusal(BATCH if batch else DEFAULT_REQUEST_CLASS, tenant or "", reason)
    message = (queue_full_message(queue.depth, retry_s) if reason == "queue_full"
               else tenant_limit_message(tenant or "", queue.tenant_max_queued or 0, retry_s))
    return Refusal(429, _json(error_body(429, message, code=reason)), ((b"retry-after", str(retry_s).encode()),))


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


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None
