"""RequestStream: one request's events on the HTTP side, with a bounded buffer, and its admission future.

Events arrive on the event loop (`call_soon_threadsafe` from the engine client's receiving thread) and never
block it: when a client reads too slowly for its buffer to drain, the request is aborted with
`abort_reason="slow_client"`, so one straggler never holds memory or slows the batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TokenEvent:
    token_ids: list[int]  # new since the previous event
    text: str  # new since the previous event
    finish_reason: str | None  # set on the last event only: "stop", "length", "abort"
    num_prompt_tokens: int
    num_output_tokens: int  # so far
    abort_reason: str | None = None  # with finish_reason "abort": "slow_client", "client_gone", ...


class _Aborter(Protocol):
    def abort(self, request_id: str, reason: str) -> None: ...


class RequestStream:
    """Async iterator of one request's TokenEvents; the last one carries `finish_reason`.

    `admitted` completes when the engine admits the request, or when the stream ends before that.
    """

    def __init__(self, engine: _Aborter, request_id: str, num_prompt_tokens: int, max_buffer_events: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = 0
        self.admitted: asyncio.Future[None] = loop.create_future()
        self._engine = engine
        self._loop = loop
        self._max_buffer = max_buffer_events
        self._events: deque[TokenEvent] = deque()
        self._ready = asyncio.Event()
        self._closed = False  # the final event is in the buffer; later pushes are dropped
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
        self.num_output_tokens = max(self.num_output_tokens, event.num_output_tokens)
        self._events.append(event)
        self._closed = event.finish_reason is not None
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
        if event.finish_reason is not None:
            self._done = True
        return event


def deliver(stream: RequestStream, callback_name: str, *args: object) -> bool:
    """Run `stream.<callback_name>(*args)` on the stream's loop without waiting; False if that loop is closed."""
    try:
        stream._loop.call_soon_threadsafe(getattr(stream, callback_name), *args)
    except RuntimeError:
        return False
    return True
