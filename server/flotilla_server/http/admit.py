"""The door of a generation request, and the one mapping from admission's refusals to HTTP errors.

Order: draining (503) → feasibility (400) → admission queue (429 full / 429 timeout / 499 gone). Each
refusal's rejection reason is counted here, its status code by the error handler.
"""

from __future__ import annotations

from fastapi import Request

from flotilla_server.engine.client import RequestStream
from flotilla_server.http.admission import ClientGone, QueueFull, QueueTimeout, TenantLimit
from flotilla_server.http.door import DOOR_TICKET
from flotilla_server.http.errors import APIError
from flotilla_server.http.job import Job
from flotilla_server.http.refusals import (
    CLIENT_GONE,
    DRAINING_HEADERS,
    DRAINING_MESSAGE,
    infeasible_message,
    queue_full_message,
    queue_timeout_message,
    retry_after_s,
    tenant_limit_message,
)
from flotilla_server.http.state import ServerState
from flotilla_server.http.stream_response import wait_for_disconnect


async def admit(request: Request, state: ServerState, job: Job) -> tuple[RequestStream, float]:
    """Returns the engine stream and the queue wait, or raises APIError."""
    m = state.metrics
    if state.draining:  # the shedder checked before the body was read; draining may have begun since
        m.count_rejection("draining")
        raise APIError(503, DRAINING_MESSAGE, code="draining", headers=dict(DRAINING_HEADERS))
    why = next((w for p in job.prompts if (w := state.engine.check_feasible(len(p), job.params.max_tokens))), None)
    if why is not None:
        m.count_rejection("infeasible")
        raise APIError(400, infeasible_message(why), param="max_tokens", code="context_length_exceeded")
    params, queue = job.params, state.admission
    timeout_s = queue.timeout_s(params.request_class)
    retry_s = retry_after_s(timeout_s)
    retry = {"Retry-After": str(retry_s)}
    ticket = request.scope.get(DOOR_TICKET)

    def refused(reason: str) -> None:
        m.count_rejection(reason)
        m.classes.count_rejection(params, reason)

    try:
        return await queue.admit(job.request_id, job.prompts[0], params, lambda: wait_for_disconnect(request),
                                 on_queued=ticket.release if ticket is not None else None,
                                 extra_prompts=job.prompts[1:])
    except QueueFull:
        refused("queue_full")
        raise APIError(429, queue_full_message(queue.depth, retry_s), code="queue_full", headers=retry) from None
    except TenantLimit:
        refused("tenant_limit")
        raise APIError(429, tenant_limit_message(params.tenant, queue.tenant_max_queued or 0, retry_s),
                       code="tenant_limit", headers=retry) from None
    except QueueTimeout:
        refused("queue_timeout")
        raise APIError(429, queue_timeout_message(timeout_s, retry_s), code="queue_timeout", headers=retry) from None
    except ClientGone:
        refused("client_gone")
        raise APIError(CLIENT_GONE, "Client closed the request.", code="client_gone") from None
