"""EngineClient: the HTTP side's handle on one engine, in its own process (default) or on a thread.

The interface, all the HTTP side (and a multi-model server) sees:

- `factory.make_engine(config, mode="process"|"inprocess", options=EngineOptions(...))` builds a client over
  its backend (engine/backends.py); `start() -> EngineInfo` (name, tokenizer, limits) loads the model.
  Several clients may run in one server, one engine process each.
- `submit(request_id, prompt_token_ids, params, loop) -> RequestStream`: the engine queues it and admits it
  when it fits; `stream.admitted` completes then. `abort(request_id, reason)` at any time.
- `check_feasible`, `stats()` (the state after the engine's last turn, never a round trip), step, abort
  and death listeners, `alive`, and `shutdown()`, which returns once the engine's memory is free.
- `await adapter_call(LoadAdapter | UnloadAdapter) -> AdapterReply`: the engine answers once the adapter is
  read (off the event loop, engine/adapter_service.py); if the engine stops first the answer is a 503.

The engine applies `submit` and `abort` only between steps (engine/loop.py). An abort ends the stream here
at once, with its reason; the engine frees the blocks before its next step. If the engine dies, every
stream ends with abort_reason "engine_error" and the death listeners are told. Torch-free
(docs/architecture.md, "Layers").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from flotilla_server.engine.feasibility import infeasible_reason
from flotilla_server.engine.messages import (
    ADAPTER_NOT_SERVED,
    NOT_SERVED_PREFIX,
    AbortRequest,
    AdapterReply,
    AddRequest,
    EngineInfo,
    EngineOptions,
    EngineStartError,
    EngineUpdate,
    LoadAdapter,
    UnloadAdapter,
)
from flotilla_server.engine.outputs import EngineStats, StepListener
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.stream import RequestStream, TokenEvent, deliver

__all__ = ["EngineClient", "EngineInfo", "EngineOptions", "EngineStartError", "RequestStream", "TokenEvent"]

log = logging.getLogger(__name__)

DEFAULT_STREAM_BUFFER_EVENTS = 256
ENGINE_MODES = ("process", "inprocess")

EngineMode = Literal["process", "inprocess"]
AbortListener = Callable[[str, str], None]  # (request_id, reason)
DeathListener = Callable[[str], None]  # (what happened)


class Backend(Protocol):
    """Where the engine loop runs (engine/backends.py: ProcessBackend, ThreadBackend)."""

    def start(self, on_update: Callable[[EngineUpdate], None], on_death: Callable[[str], None]) -> EngineInfo: ...

    def send(self, message: Any) -> None: ...

    def close(self, timeout_s: float) -> None: ...


class EngineClient:
    def __init__(self, backend: Backend, *, stream_buffer_events: int = DEFAULT_STREAM_BUFFER_EVENTS) -> None:
        if stream_buffer_events < 1:
            raise ValueError(f"stream_buffer_events must be >= 1, got {stream_buffer_events}")
        self.stream_buffer_events = stream_buffer_events
        self._backend = backend
        self.info: EngineInfo | None = None
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()  # guards _streams: the event loop and the receiving thread share it
        self._stats: EngineStats | None = None
        self._step_listeners: list[StepListener] = []
        self._abort_listeners: list[AbortListener] = []
        self._death_listeners: list[DeathListener] = []
        self._alive = False
        self._stopped = False
        # adapter calls waiting for the engine's answer: call id -> (its event loop, its future)
        self._calls: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[AdapterReply]]] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> EngineInfo:
        """Load the model and start the engine; raises EngineStartError with what to change."""
        self.info = self._backend.start(self._on_update, self._on_death)
        self._stats = EngineStats(0, 0, self.info.num_slots, 0, self.info.num_kv_blocks, 0,
                                  adapters_served=self.info.adapters)
        self._alive = True
        return self.info

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int:
        return self.info.pid if self.info is not None else 0

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the engine; requests still running end with abort_reason "shutdown". In the process mode
        the engine process has exited (and its memory is free) when this returns."""
        if self._stopped:
            return
        self._stopped = True
        self._alive = False
        self._end_all("shutdown")
        self._backend.close(timeout_s)

    # --- requests -------------------------------------------------------------------------------

    def check_feasible(self, num_prompt_tokens: int, max_tokens: int, n: int = 1) -> str | None:
        info = self._info()
        return infeasible_reason(num_prompt_tokens, max_tokens, info.max_model_len, info.num_kv_blocks,
                                 info.block_size, n, info.num_slots)

    def submit(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
               loop: asyncio.AbstractEventLoop, extra_prompts: Sequence[Sequence[int]] = ()) -> RequestStream:
        """Queue a request in the engine: n choices of each prompt (`prompt_token_ids`, then `extra_prompts`).
        Raises ValueError if it could never fit or its id is in use."""
        prompts = [list(prompt_token_ids), *(list(p) for p in extra_prompts)]
        for prompt in prompts:
            why = self.check_feasible(len(prompt), params.max_tokens, params.n)
            if why is not None:
                raise ValueError(why)
        stream = RequestStream(self, request_id, sum(map(len, prompts)), self.stream_buffer_events, loop,
                               num_choices=len(prompts) * params.n)
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
        if not self._alive:
            self._end(request_id, "engine_error")
            return stream
        self._backend.send(AddRequest(request_id, prompts[0], params, prompts[1:]))
        return stream

    def abort(self, request_id: str, reason: str) -> None:
        """Any thread: the stream ends now with this abort_reason; the engine frees the blocks before its
        next step. A request already finished is left alone."""
        for listener in self._abort_listeners:
            listener(request_id, reason)
        if self._end(request_id, reason) and self._alive:
            self._backend.send(AbortRequest(request_id))

    async def adapter_call(self, message: LoadAdapter | UnloadAdapter) -> AdapterReply:
        """Send an adapter load or unload and wait, on the event loop, for the engine's answer."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AdapterReply] = loop.create_future()
        with self._lock:
            self._calls[message.call_id] = (loop, future)
        if not self._alive:
            self._answer(AdapterReply(message.call_id, 503, "The engine is not running."))
        else:
            self._backend.send(message)
        return await future

    def _answer(self, reply: AdapterReply) -> None:
        """Any thread: complete the call's future on its event loop."""
        with self._lock:
            waiting = self._calls.pop(reply.call_id, None)
        if waiting is None:
            return
        loop, future = waiting
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(reply))

    def _end(self, request_id: str, reason: str) -> bool:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is None:
            return False
        deliver(stream, "_push", TokenEvent([], "", "abort", stream.num_prompt_tokens, stream.num_output_tokens, reason))
        return True

    def _end_all(self, reason: str) -> None:
        with self._lock:
            ids, calls = list(self._streams), list(self._calls)
        for rid in ids:
            self._end(rid, reason)
        for call_id in calls:
            self._answer(AdapterReply(call_id, 503, f"The engine stopped ({reason}) before answering."))

    # --- observation ----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """The engine's state after its last turn (admissions, steps and aborts it has applied)."""
        if self._stats is None:
            raise RuntimeError("EngineClient.start() was not called")
        return self._stats

    def add_step_listener(self, listener: StepListener) -> None:
        """`listener(StepRecord)` after every step, on the receiving thread."""
        self._step_listeners.append(listener)

    def add_abort_listener(self, listener: AbortListener) -> None:
        """`listener(request_id, reason)` on every abort, on the aborting thread (slow_client is counted at once)."""
        self._abort_listeners.append(listener)

    def add_death_listener(self, listener: DeathListener) -> None:
        """`listener(what)` once, if the engine stops without `shutdown()` (crash, killed process)."""
        self._death_listeners.append(listener)

    def _info(self) -> EngineInfo:
        if self.info is None:
            raise RuntimeError("EngineClient.start() was not called")
        return self.info

    # --- the receiving thread -------------------------------------------------------------------

    def _on_update(self, update: EngineUpdate) -> None:
        self._stats = update.stats  # before the answers: a loaded adapter is served once its caller hears it
        for reply in update.adapter_replies:
            self._answer(reply)
        for rid, why in update.refused:
            log.warning("the engine refused request %s: %s", rid, why)
            self._end(rid, ADAPTER_NOT_SERVED if why.startswith(NOT_SERVED_PREFIX) else "engine_error")
        with self._lock:
            admitted = [s for rid in update.admitted if (s := self._streams.get(rid)) is not None]
        for stream in admitted:
            deliver(stream, "_admit")
        for out in update.outputs:
            with self._lock:
                stream = self._streams.get(out.request_id)
                if stream is not None and out.finished:
                    stream.open_choices -= 1  # only this thread counts them
                    if stream.open_choices == 0:
                        del self._streams[out.request_id]
            if stream is None:
                continue  # aborted meanwhile
            event = TokenEvent(out.token_ids, out.text, out.finish_reason, out.num_prompt_tokens,
                               out.num_output_tokens, index=out.index, logprobs=out.logprobs)
            if not deliver(stream, "_push", event):
                self.abort(out.request_id, "client_gone")
        if update.record is not None:
            for listener in self._step_listeners:
                listener(update.record)

    def _on_death(self, what: str) -> None:
        if self._stopped:
            return
        log.error("%s: every request in flight fails", what)
        self._alive = False
        self._end_all("engine_error")
        for listener in self._death_listeners:
            listener(what)
