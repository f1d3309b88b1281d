"""One generation request from the door to the last byte, shared by /v1/completions and /v1/chat/completions.

Order at the door: draining (503) → feasibility (400) → admission queue (429 full / 429 timeout / 499
gone). Then either a JSON body or an SSE stream. Whatever ends the request (finish, client gone, slow
client, error), the engine request is aborted if still running, the in-flight count drops, and exactly
one status code is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from flotilla_server import sse
from flotilla_server.admission import ClientGone, QueueFull, QueueTimeout, retry_after_s
from flotilla_server.api.errors import APIError
from flotilla_server.api.shedder import DOOR_TICKET, DRAINING_MESSAGE, queue_full_message
from flotilla_server.sampling_params import SamplingParams
from flotilla_server.state import ServerState

log = logging.getLogger("flotilla.server")

CLIENT_GONE = 499  # nginx's code for "client closed request"; never counted as a server error


@dataclass
class Job:
    chat: bool  # chat.completion shapes, else text_completion
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has closed its connection (the request body was already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _GuardedStream(StreamingResponse):
    """A StreamingResponse whose clean-up runs even if the body iterator never started."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=sse.SSE_HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class _Outcome:
    """Counts exactly one status code and one rejection reason per request; aborts the engine request once."""

    def __init__(self, state: ServerState, request_id: str) -> None:
        self.state = state
        self.request_id = request_id
        self.code: int | None = None
        self.reason: str | None = None
        self.engine_done = False
        self.closed = False
        state.live.add(request_id)

    def finish(self, code: int, reason: str | None = None) -> None:
        if self.code is None:
            self.code, self.reason = code, reason

    def close(self) -> None:
        """Idempotent: abort the engine request if it still runs, count the outcome, leave in-flight."""
        if self.closed:
            return
        self.closed = True
        state, rid = self.state, self.request_id
        if not self.engine_done:
            self.finish(CLIENT_GONE, "client_gone")
            state.engine.abort(rid, "client_gone")
        code, reason = self.code or CLIENT_GONE, self.reason
        slow = rid in state.slow_clients  # counted when the engine cut it off
        state.live.discard(rid)
        state.slow_clients.discard(rid)
        m = state.metrics
        m.count_request(CLIENT_GONE if slow else code)
        if slow:
            log.info("request %s: client read too slowly; cancelled (slow_client)", rid)
        elif reason is not None:
            m.count_rejection(reason)
            if reason == "client_gone":
                log.info("request %s: client went away; generation cancelled (499)", rid)
        state.leave()


async def admit(request: Request, state: ServerState, job: Job) -> tuple[Any, float]:
    """The door: returns the engine stream and the queue wait, or raises APIError (its rejection reason counted
    here, its status code by the error handler)."""
    m = state.metrics
    if state.draining:
        m.count_rejection("draining")
        raise APIError(503, DRAINING_MESSAGE,
                       code="draining", headers={"Retry-After": "1", "Connection": "close"})
    why = state.engine.check_feasible(len(job.prompt_token_ids), job.params.max_tokens)
    if why is not None:
        m.count_rejection("infeasible")
        raise APIError(400, f"This request can never fit: {why}. Shorten the prompt or lower max_tokens.",
                       param="max_tokens", code="context_length_exceeded")
    retry = {"Retry-After": str(retry_after_s(state.admission.queue_timeout_s))}
    ticket = request.scope.get(DOOR_TICKET)
    try:
        return await state.admission.admit(job.request_id, job.prompt_token_ids, job.params,
                                           lambda: wait_for_disconnect(request),
                                           on_queued=ticket.release if ticket is not None else None)
    except QueueFull:
        m.count_rejection("queue_full")
        raise APIError(429, queue_full_message(state.admission.depth, int(retry["Retry-After"])),
                       code="queue_full", headers=retry) from None
    except QueueTimeout:
        m.count_rejection("queue_timeout")
        raise APIError(429, f"The request waited longer than {state.admission.queue_timeout_s:g} s for a slot: "
                            f"retry after {retry['Retry-After']} s or send to another replica.",
                       code="queue_timeout", headers=retry) from None
    except ClientGone:
        m.count_rejection("client_gone")
        raise APIError(CLIENT_GONE, "Client closed the request.", code="client_gone") from None


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
    outcome = _Outcome(state, job.request_id)
    if job.stream:
        return _GuardedStream(_sse_body(state, job, stream, outcome, arrival_s), outcome.close)
    try:
        return await _json_body(request, state, job, stream, outcome, arrival_s)
    finally:
        outcome.close()


class _Timing:
    def __init__(self, state: ServerState, arrival_s: float) -> None:
        self.m = state.metrics
        self.arrival_s = arrival_s
        self.last_s: float | None = None
        self.prompt_counted = False

    def on_event(self, event: Any) -> None:
        n = len(event.token_ids)
        if not self.prompt_counted:
            self.m.prompt_tokens.labels(self.m.model).inc(event.num_prompt_tokens)
            self.prompt_counted = True
        if n == 0:
            return
        now = time.monotonic()
        if self.last_s is None:
            self.m.ttft.labels(self.m.model).observe(now - self.arrival_s)
        else:
            self.m.itl.labels(self.m.model).observe(now - self.last_s)
        self.last_s = now
        self.m.generation_tokens.labels(self.m.model).inc(n)

    def done(self) -> None:
        self.m.request_duration.labels(self.m.model).observe(time.monotonic() - self.arrival_s)


def _abort_message(reason: str | None) -> tuple[str, str]:
    if reason == "drain_timeout":
        return ("The server shut down before this request finished (--drain-timeout-s passed): "
                "retry against another replica."), "draining"
    if reason == "slow_client":
        return ("The client read the stream too slowly and its buffer filled: the request was cancelled. "
                "Read the stream as it arrives."), "slow_client"
    return f"Generation was aborted ({reason or 'unknown reason'}).", reason or "aborted"


async def _json_body(request: Request, state: ServerState, job: Job, stream: Any, outcome: _Outcome,
                     arrival_s: float) -> Response:
    timing = _Timing(state, arrival_s)
    parts: list[str] = []
    last: Any = None

    async def consume() -> None:
        nonlocal last
        async for event in stream:
            timing.on_event(event)
            parts.append(event.text)
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
    if last is None or last.finish_reason is None or last.finish_reason == "abort":
        message, code = _abort_message(getattr(last, "abort_reason", None))
        status = 503 if code == "draining" else 500  # as a stream cut by the drain timeout is counted
        outcome.finish(status, None)
        raise APIError(status, message, code=code, counted=True)
    outcome.finish(200)
    u = sse.usage(last.num_prompt_tokens, last.num_output_tokens)
    text = "".join(parts)
    shape = sse.chat_response if job.chat else sse.completion_response
    return JSONResponse(shape(job.request_id, int(time.time()), state.served_model_name, text,
                              last.finish_reason, u))


async def _sse_body(state: ServerState, job: Job, stream: Any, outcome: _Outcome,
                    arrival_s: float) -> AsyncIterator[bytes]:
    timing = _Timing(state, arrival_s)
    model, created, rid = state.served_model_name, int(time.time()), job.request_id

    if job.chat:
        delta_chunk = sse.DeltaEncoder(lambda t: sse.chat_chunk(rid, created, model, {"content": t}))
    else:
        delta_chunk = sse.DeltaEncoder(lambda t: sse.completion_chunk(rid, created, model, t))

    def chunk(text: str, finish_reason: str | None = None, u: dict[str, int] | None = None) -> bytes:
        if job.chat:
            delta = {"content": text} if text or finish_reason is None else {}
            return sse.sse_event(sse.chat_chunk(rid, created, model, delta, finish_reason, u))
        return sse.sse_event(sse.completion_chunk(rid, created, model, text, finish_reason, u))

    if job.chat:
        yield sse.sse_event(sse.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}))
    try:
        async for event in stream:
            timing.on_event(event)
            if event.finish_reason == "abort":
                outcome.engine_done = True
                message, code = _abort_message(event.abort_reason)
                outcome.finish({"slow_client": CLIENT_GONE, "draining": 503}.get(code, 500))
                yield sse.sse_event(sse.error_chunk(message, code))
                yield sse.DONE
                return
            if event.finish_reason is not None:
                outcome.engine_done = True
                timing.done()
                u = sse.usage(event.num_prompt_tokens, event.num_output_tokens)
                yield chunk(event.text, event.finish_reason, u)
                yield sse.DONE
                outcome.finish(200)
                return
            if event.text or event.token_ids:  # one chunk per engine event, even while text is held back
                yield delta_chunk(event.text)
        outcome.engine_done = True  # the stream ended without a finish event: report, never hang
        outcome.finish(500)
        yield sse.sse_event(sse.error_chunk("The engine ended the stream without a finish reason.", "engine_error"))
        yield sse.DONE
    except (asyncio.CancelledError, GeneratorExit):
        outcome.finish(CLIENT_GONE, "client_gone")
        raise
    except Exception as e:  # an engine failure after the stream started: error chunk, then [DONE]
        log.exception("request %s failed mid-stream", rid)
        outcome.finish(500)
        yield sse.sse_event(sse.error_chunk(f"Generation failed: {type(e).__name__}.", "engine_error"))
        yield sse.DONE
