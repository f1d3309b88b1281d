"""A streamed answer: one SSE chunk per engine event, each choice's last with its finish_reason, the usage chunk
if asked, then [DONE].

The choices of a request (`n`, a list of prompts) interleave as their tokens come, each chunk naming its
choice's `index`, as OpenAI streams them; chat opens every choice with a role delta, and an echoed prompt
opens each completions choice.

An abort or an engine failure after the stream started cannot change the status line any more: it ends
the stream with an error chunk, then [DONE] (docs/architecture.md, "A request's path").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from flotilla_server.engine.client import RequestStream
from flotilla_server.http import reply
from flotilla_server.http.accounting import Outcome, Timing
from flotilla_server.http.job import Job
from flotilla_server.http.refusals import CLIENT_GONE, abort_message
from flotilla_server.http.state import ServerState

log = logging.getLogger("flotilla.server")


async def sse_body(state: ServerState, job: Job, stream: RequestStream, outcome: Outcome,
                    arrival_s: float) -> AsyncIterator[bytes]:
    timing = Timing(state, arrival_s, job.num_prompt_tokens, job.params)
    choices = reply.Choices(job, state.tokenizer.decode)
    # an adapter's reply names the adapter, as the request did (vLLM does the same)
    model, created, rid, iu = job.params.lora or state.served_model_name, int(time.time()), job.request_id, job.include_usage
    encoders: dict[int, reply.DeltaEncoder] = {}  # per choice: its plain text chunks, pre-rendered

    def delta_chunk(index: int, text: str) -> bytes:
        encode = encoders.get(index)
        if encode is None:
            if job.chat:
                encode = reply.DeltaEncoder(lambda t: reply.chat_chunk(rid, created, model, {"content": t}, None, iu, index))
            else:
                encode = reply.DeltaEncoder(lambda t: reply.completion_chunk(rid, created, model, t, None, iu, index))
            encoders[index] = encode
        return encode(text)

    def chunk(index: int, text: str, finish_reason: str | None = None, logprobs: object = None) -> bytes:
        if job.chat:
            delta = {"content": text} if text or finish_reason is None else {}
            return reply.sse_event(reply.chat_chunk(rid, created, model, delta, finish_reason, iu, index, logprobs))
        return reply.sse_event(reply.completion_chunk(rid, created, model, text, finish_reason, iu, index, logprobs))

    readers = {i: r for i in range(job.num_choices) if (r := job.tool_reader()) is not None}  # chat with tools

    for index in range(job.num_choices):
        if job.chat:
            yield reply.sse_event(reply.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None, iu,
                                               index))
        elif job.echo(index):
            yield chunk(index, job.echo(index))
    try:
        async for event in stream:
            timing.on_event(event)
            if event.finish_reason == "abort":
                outcome.engine_done = True
                message, code = abort_message(event.abort_reason)
                outcome.finish({"slow_client": CLIENT_GONE, "draining": 503, "model_not_found": 404}.get(code, 500))
                yield reply.sse_event(reply.error_chunk(message, code))
                yield reply.DONE
                return
            choices.on_event(event)
            reader = readers.get(event.index)
            if reader is not None:  # the reply read for tool calls: content and call deltas (no logprobs here)
                deltas = reader.feed(event.text) + (reader.finish() if event.finish_reason is not None else [])
                for delta in deltas:
                    yield reply.sse_event(reply.chat_chunk(rid, created, model, delta, None, iu, event.index))
                if event.finish_reason is None:
                    if not deltas and event.token_ids:  # one chunk per engine event, even while text is held back
                        yield delta_chunk(event.index, "")
                    continue
                event = replace(event, text="", finish_reason=reader.finish_reason(event.finish_reason))
            logprobs = choices.chunk_logprobs(event)
            if event.finish_reason is not None:
                if choices.done:  # the request's last event
                    outcome.engine_done = True
                    timing.done()
                yield chunk(event.index, event.text, event.finish_reason, logprobs)
                if not choices.done:
                    continue
                if iu:
                    yield reply.sse_event(reply.usage_chunk(rid, created, model, job.chat, choices.usage()))
                yield reply.DONE
                outcome.finish(200)
                return
            if logprobs is not None:
                yield chunk(event.index, event.text, None, logprobs)
            elif event.text or event.token_ids:  # one chunk per engine event, even while text is held back
                yield delta_chunk(event.index, event.text)
        outcome.engine_done = True  # the stream ended without a finish event: report, never hang
        outcome.finish(500)
        yield reply.sse_event(reply.error_chunk("The engine ended the stream without a finish reason.", "engine_error"))
        yield reply.DONE
    except (asyncio.CancelledError, GeneratorExit):
        outcome.finish(CLIENT_GONE, "client_gone")
        raise
    except Exception as e:  # an engine failure after the stream started: error chunk, then [DONE]
        log.exception("request %s failed mid-stream", rid)
        outcome.finish(500)
        yield reply.sse_event(reply.error_chunk(f"Generation failed: {type(e).__name__}.", "engine_error"))
        yield reply.DONE
