"""One generation request from the door to the last byte, shared by /v1/completions and /v1/chat/completions.

The door (`admit`), then either one JSON body (`render_json`) or an SSE stream (`render_sse`); `Outcome`
counts exactly one status code whatever ends the request (docs/architecture.md, "A request's path").
"""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import Response

from flotilla_server.http.accounting import Outcome
from flotilla_server.http.admit import admit
from flotilla_server.http.job import Job
from flotilla_server.http.render_json import json_body
from flotilla_server.http.render_sse import sse_body
from flotilla_server.http.state import ServerState
from flotilla_server.http.stream_response import GuardedStream

__all__ = ["Job", "generate"]


async def generate(request: Request, state: ServerState, job: Job) -> Response:
    arrival_s = time.monotonic()
    state.enter()
    try:
        stream, waited_s = await admit(request, state, job)
    except BaseException:
        state.leave()
        raise
    m = state.metrics
    m.queue_wait.labels(m.model).observe(waited_s)
    m.classes.observe_queue_wait(job.params, waited_s)
    outcome = Outcome(state, job.request_id)
    if job.stream:
        return GuardedStream(sse_body(state, job, stream, outcome, arrival_s), outcome.close)
    try:
        return await json_body(request, state, job, stream, outcome, arrival_s)
    finally:
        outcome.close()
