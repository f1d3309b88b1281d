"""EngineClient: the engine loop in its own thread, and per-request async streams; all the HTTP side sees.

The engine thread never waits on a client: it hands each event to the asyncio loop with
`call_soon_threadsafe`. Each `RequestStream` holds a bounded buffer; when a client reads too
slowly for it to drain, the request is aborted with `abort_reason="slow_client"` and its blocks
are freed, so one straggler never holds memory or slows the batch.

Abort listeners are told of every abort with its reason, on the thread that aborted: a slow client is
aborted by its own stream while the handler is blocked sending to that very client, so the handler cannot
be the one to count it. The client owns the listeners; a stream aborts through its client, never above it.

This module stays torch-free (the core is only a type here), so the HTTP layer can import it
(docs/architecture.md, "Layers").
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flotilla_server.engine.outputs import EngineStats, RequestOutput, StepListener
from flotilla_server.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from flotilla_server.engine.core import EngineCore

log = logging.getLogger(__name__)

DEFAULT_STREAM_BUFFER_EVENTS = 256
IDLE_WAIT_S = 0.5  # the loop sleeps this long at most when idle; new requests wake it at once

AbortListener = Callable[[str, str], None]  # (request_id, reason)


@dataclass(frozen=True)
class TokenEvent:
    token_ids: list[int]  # new since the previous event
    text: str  # new since the previous event
    finish_reason: str | None  # set on the last event only: "stop", "length", "abort"
    num_prompt_tokens: int
    num_output_tokens: int  # so far
    abort_reason: str | None = None  # with finish_reason "abort": "slow_client", "client_gone", ...


class RequestStream:
    """Async iterator of one request's TokenEvents; the last one carries `finish_reason`."""

    def __init__(self, engine: EngineClient, request_id: str, num_prompt_tokens: int, max_buffer_events: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = 0
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


class EngineClient:
    def __init__(self, core: EngineCore, stream_buffer_events: int = DEFAULT_STREAM_BUFFER_EVENTS) -> None:
        if stream_buffer_events < 1:
            raise ValueError(f"stream_buffer_events must be >= 1, got {stream_buffer_events}")
        self.core = core
        self.stream_buffer_events = stream_buffer_events
        self._streams: dict[str, RequestStream] = {}
        self._streams_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._abort_listeners: list[AbortListener] = []

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flotilla-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; requests still running end with abort_reason "shutdown"."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self._streams_lock:
            ids = list(self._streams)
        for rid in ids:
            self.abort(rid, "shutdown")

    # --- requests -------------------------------------------------------------------------------

    def check_feasible(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        return self.core.check_feasible(num_prompt_tokens, max_tokens)

    def try_add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
    ) -> RequestStream | None:
        """Admit now, or return None (a deferral counted as "no_slot" or "no_blocks").

        Raises ValueError if the request could never fit (see `check_feasible`) or its id is in use.
        """
        stream = RequestStream(self, request_id, len(prompt_token_ids), self.stream_buffer_events, loop)
        with self._streams_lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream  # before admission: the first token may come at once
        try:
            reason = self.core.try_admit(request_id, prompt_token_ids, params)
        except BaseException:
            self._drop(request_id)
            raise
        if reason is not None:
            self._drop(request_id)
            return None
        self._wake.set()
        return stream

    def abort(self, request_id: str, reason: str) -> None:
        """Thread-safe: frees the request's blocks now; its stream ends with this abort_reason."""
        for listener in self._abort_listeners:
            listener(request_id, reason)
        self.core.abort(request_id)
        stream = self._drop(request_id)
        if stream is not None:
            event = TokenEvent([], "", "abort", stream.num_prompt_tokens, stream.num_output_tokens, reason)
            _deliver(stream, event)

    def _drop(self, request_id: str) -> RequestStream | None:
        with self._streams_lock:
            return self._streams.pop(request_id, None)

    # --- observation ----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        return self.core.stats()

    def add_step_listener(self, listener: StepListener) -> None:
        self.core.add_step_listener(listener)

    def add_abort_listener(self, listener: AbortListener) -> None:
        self._abort_listeners.append(listener)

    # --- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            if not self.core.has_unfinished():
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                continue
            try:
                outputs = self.core.step()
            except Exception:
                log.exception("engine step failed; aborting every running request")
                with self._streams_lock:
                    ids = list(self._streams)
                for rid in ids:
                    self.abort(rid, "engine_error")
                continue
            self._dispatch(outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            with self._streams_lock:
                stream = self._streams.pop(out.request_id, None) if out.finished else self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted meanwhile
            event = TokenEvent(out.token_ids, out.text, out.finish_reason, out.num_prompt_tokens, out.num_output_tokens)
            if not _deliver(stream, event):
                self.abort(out.request_id, "client_gone")


def _deliver(stream: RequestStream, event: TokenEvent) -> bool:
    """Hand an event to the stream's loop without waiting; False if that loop is closed (nobody reads)."""
    try:
        stream._loop.call_soon_threadsafe(stream._push, event)
    except RuntimeError:
        return False
    return True
