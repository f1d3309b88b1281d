"""A whole (non-streamed) answer: join each choice's text into one OpenAI JSON body, or one error."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from flotilla_server.engine.client import RequestStream, TokenEvent
from flotilla_server.http import reply
from flotilla_server.http.accounting import Outcome, Timing
from flotilla_server.http.errors import APIError
from flotilla_server.http.job import Job
from flotilla_server.http.refusals import CLIENT_GONE, DRAINING_HEADERS, abort_message
from flotilla_server.http.state import ServerState
from flotilla_server.http.stream_response import wait_for_disconnect


async def json_body(request: Request, state: ServerState, job: Job, stream: RequestStream, outcome: Outcome,
                    arrival_s: float) -> Response:
    timing = Timing(state, arrival_s, job.num_prompt_tokens, job.params)
    choices = reply.Choices(job, state.tokenizer.decode)
    last: TokenEvent | None = None

    async def consume() -> None:
        nonlocal last
        async for event in stream:
            timing.on_event(event)
            if event.finish_reason != "abort":
                choices.collect(event)
            last = event

    consumer = asyncio.ensure_future(consume())
    gone = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({consumer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not consumer.done():
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
    if consumer not in done:
        outcome.finish(CLIENT_GONE, "client_gone")
        return Response(status_code=CLIENT_GONE)
    consumer.result()  # re-raise an engine failure
    outcome.engine_done = True
    timing.done()
    if last is None or not choices.done:
        message, code = abort_message(last.abort_reason if last is not None else None)
        # 503 as a stream cut by the drain timeout is counted; 404 for an adapter unloaded before it started
        status = {"draining": 503, "model_not_found": 404}.get(code, 500)
        outcome.finish(status, None)
        headers = dict(DRAINING_HEADERS) if code == "draining" else None  # as every draining 503 has
        raise APIError(status, message, code=code, headers=headers, counted=True)
    outcome.finish(200)
    return JSONResponse(reply.response(job.request_id, int(time.time()), job.params.lora or state.served_model_name, job.chat,
                                     choices.rendered(), choices.usage()))
