"""A streamed answer: one SSE chunk per engine event, the last with finish_reason, the usage chunk if asked, then [DONE].

An abort or an engine failure after the stream started cannot change the status line any more: it ends
the stream with an error chunk, then [DONE] (docs/architecture.md, "A request's path").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from flotilla_server.engine.client import RequestStream
from flotilla_server.http import sse
from flotilla_server.http.accounting import Outcome, Timing
from flotilla_server.http.job import Job
from flotilla_server.http.refusals import CLIENT_GONE, abort_message
from flotilla_server.http.state import ServerState

log = logging.getLogger("flotilla.server")


async def sse_body(state: ServerState, job: Job, stream: RequestStream, outcome: Outcome,
                    arrival_s: float) -> AsyncIterator[bytes]:
    timing = Timing(state, arrival_s)
    model, created, rid, iu = state.served_model_name, int(time.time()), job.request_id, job.include_usage

    if job.chat:
        delta_chunk = sse.DeltaEncoder(lambda t: sse.chat_chunk(rid, created, model, {"content": t}, None, iu))
    else:
        delta_chunk = sse.DeltaEncoder(lambda t: sse.completion_chunk(rid, created, model, t, None, iu))

    def chunk(text: str, finish_reason: str | None = None) -> bytes:
        if job.chat:
            delta = {"content": text} if text or finish_reason is None else {}
            return sse.sse_event(sse.chat_chunk(rid, created, model, delta, finish_reason, iu))
        return sse.sse_event(sse.completion_chunk(rid, created, model, text, finish_reason, iu))

    if job.chat:
        yield sse.sse_event(sse.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None, iu))
    try:
        async for event in stream:
            timing.on_event(event)
            if event.finish_reason == "abort":
                outcome.engine_done = True
                message, code = abort_message(event.abort_reason)
                outcome.finish({"slow_client": CLIENT_GONE, "draining": 503}.get(code, 500))
                yield sse.sse_event(sse.error_chunk(message, code))
                yield sse.DONE
                return
            if event.finish_reason is not None:
                outcome.engine_done = True
                timing.done()
                yield chunk(event.text, event.finish_reason)
                if iu:
                    u = sse.usage(event.num_prompt_tokens, event.num_output_tokens)
                    yield sse.sse_event(sse.usage_chunk(rid, created, model, job.chat, u))
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
