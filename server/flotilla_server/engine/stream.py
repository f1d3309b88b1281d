"""RequestStream: one request's events on the HTTP side, with a bounded buffer, and its admission future.

A request with several choices (`n`, a list of prompts) has one stream: its events carry the choice's
`index`, each choice's last event its `finish_reason`, and the stream ends after every choice's last
event, or at once with an abort.

Events arrive on the event loop (`call_soon_threadsafe` from the engine client's receiving thread) and never
block it: when a client reads too slowly for its buffer to drain, the request is aborted with
`abort_reason="slow_client"`, so one straggler never holds memory or slows the batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from flotilla_server.engine.outputs import TokenLogprobs


@dataclass(frozen=True)
class TokenEvent:
    token_ids: list[int]  # new since the previous event of this choice
    text: str  # new since the previous event of this choice
    finish_reason: str | None  # set on a choice's last event only: "stop", "length"; "abort" ends every choice
    num_prompt_tokens: int  # of this choice's prompt; of the whole request on an abort
    num_output_tokens: int  # of this choice so far; of the whole request on an abort
    abort_reason: str | None = None  # with finish_reason "abort": "slow_client", "client_gone", ...
    index: int = 0  # the choice: prompt number x n + j
    logprobs: list[TokenLogprobs] | None = None  # one per token, when the request asked for logprobs


class _Aborter(Protocol):
    def abort(self, request_id: str, reason: str) -> None: ...


class RequestStream:
    """Async iterator of one request's TokenEvents; the last one carries `finish_reason`.

    `admitted` completes when the engine admits the request, or when the stream ends before that.
    """

    def __init__(self, engine: _Aborter, request_id: str, num_prompt_tokens: int, max_buffer_events: int,
                 loop: asyncio.AbstractEventLoop, num_choices: int = 1) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens  # of every prompt
        self.num_choices = num_choices
        self.open_choices = num_choices  # counted down by the engine client's receiving thread alone
        self.admitted: asyncio.Future[None] = loop.create_future()
        self._engine = engine
        self._loop = loop
        self._max_buffer = max_buffer_events * num_choices  # each choice gets a buffer's worth
        self._events: deque[TokenEvent] = deque()
        self._ready = asyncio.Event()
        self._output_tokens: dict[int, int] = {}  # per choice, so far
        self.num_output_tokens = 0  # of every choice, so far (read by the engine client's thread too)
        self._finished = 0  # choices whose last event is in the buffer
        self._closed = False  # the final event is in the buffer; later pushes are dropped
        self._final: TokenEvent | None = None
        self._done = False  # the consumer has taken the final event

    @property
    def finished(self) -> bool:
        return self._closed

    def _admit(self) -> None:
        if not self.admitted.done():
            self.admitted.set_result(None)

    def _push(self, event: TokenEvent) -> None:
        """Runs on the event loop. Never blocks; overflow aborts the request."""
        if self._closed:
            return
        if event.finish_reason is None and len(self._events) >= self._max_buffer:
            self._engine.abort(self.request_id, "slow_client")
            return
        if event.finish_reason != "abort":
            before = self._output_tokens.get(event.index, 0)
            if event.num_output_tokens > before:
                self._output_tokens[event.index] = event.num_output_tokens
                self.num_output_tokens += event.num_output_tokens - before
            self._finished += event.finish_reason is not None
        self._events.append(event)
        self._closed = event.finish_reason == "abort" or self._finished == self.num_choices
        if self._closed:
            self._final = event
        self._ready.set()
        if self._closed:
            self._admit()  # a waiter whose stream ended (engine gone, shutdown) stops waiting

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenEvent:
        while not self._events:
            if self._done:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        event = self._events.popleft()
        if event is self._final:
            self._done = True
        return event


def deliver(stream: RequestStream, callback_name: str, *args: object) -> bool:
    """Run `stream.<callback_name>(*args)` on the stream's loop without waiting; False if that loop is closed."""
    try:
        stream._loop.call_soon_threadsafe(getattr(stream, callback_name), *args)
    except RuntimeError:
        return False
    return True
