"""The bounded admission queue between HTTP handlers and the engine: one driver admits everyone.

Handlers call ``AdmissionQueue.admit``; a single driver task, woken by a coalescing capacity signal
(set on every engine step, every finish and abort, and every arrival), asks the engine whether each
waiter fits. The wait budget is a timer kept beside the client's disconnect, so that a spent budget
(429 ``queue_timeout``) and a client that left (499 ``client_gone``) stay distinct.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from flotilla_server.engine.client import RequestStream
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.http.admission_policy import AdmissionPolicy

# A safety net only: every state change that can free capacity already sets the signal.
_DRIVER_FALLBACK_WAKE_S = 1.0


class Engine(Protocol):
    """What admission needs of the engine client (flotilla_server.engine.client.EngineClient)."""

    def try_add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, loop: asyncio.AbstractEventLoop
    ) -> RequestStream | None: ...

    def abort(self, request_id: str, reason: str) -> None: ...


class QueueFull(Exception):
    """The queue holds queue_depth_per_slot × max_num_seqs waiters already."""


class QueueTimeout(Exception):
    """The request waited longer than queue_timeout_s."""


class ClientGone(Exception):
    """The client disconnected while its request waited."""


@dataclass(eq=False)
class Waiter:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[RequestStream]
    enqueued_at_s: float = field(default_factory=time.monotonic)


class AdmissionQueue:
    def __init__(
        self,
        engine: Engine,
        *,
        depth: int,
        max_overtakes: int,
        queue_timeout_s: float,
    ) -> None:
        self._engine = engine
        self._policy: AdmissionPolicy[Waiter] = AdmissionPolicy(depth=depth, max_overtakes=max_overtakes)
        self.queue_timeout_s = queue_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._signal_pending = threading.Event()  # at most one wake-up in flight across threads
        self._driver: asyncio.Task | None = None
        self._stopping = False

    def __len__(self) -> int:
        return len(self._policy)

    def is_full(self) -> bool:
        return self._policy.is_full()

    @property
    def depth(self) -> int:
        return self._policy.depth

    def start(self) -> None:
        """Start the driver on the running loop; call once, from the loop."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._driver = self._loop.create_task(self._drive(), name="admission-driver")

    async def stop(self) -> None:
        # The flag, not only cancel(): on Python 3.11 wait_for can swallow a cancellation that races
        # with its inner wait completing, and a driver that outlived stop() would hang it forever.
        self._stopping = True
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
            self._driver = None

    def signal_capacity(self, *_: Any) -> None:
        """Thread-safe, coalescing: wake the driver; a second call before it runs adds nothing."""
        loop = self._loop
        if loop is None or self._signal_pending.is_set():
            return
        self._signal_pending.set()
        try:
            loop.call_soon_threadsafe(self._set_event)
        except RuntimeError:  # the loop closed during shutdown
            self._signal_pending.clear()

    def _set_event(self) -> None:
        self._signal_pending.clear()
        if self._event is not None:
            self._event.set()

    async def _drive(self) -> None:
        assert self._event is not None
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), _DRIVER_FALLBACK_WAKE_S)
            self._event.clear()
            if len(self._policy):
                self._policy.admit_round(self._try_admit)

    def _try_admit(self, waiter: Waiter) -> bool:
        assert self._loop is not None
        stream = self._engine.try_add_request(
            waiter.request_id, waiter.prompt_token_ids, waiter.params, self._loop
        )
        if stream is None:
            return False
        if waiter.future.done():  # the waiter gave up in the same tick: give the slot back
            self._engine.abort(waiter.request_id, "client_gone")
        else:
            waiter.future.set_result(stream)
        return True

    async def admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        client_gone: Callable[[], Awaitable[None]],
        on_queued: Callable[[], None] | None = None,
    ) -> tuple[RequestStream, float]:
        """Wait for admission; return (the engine's stream, seconds waited).

        Raises QueueFull at once, QueueTimeout after queue_timeout_s, ClientGone if ``client_gone()``
        completes first. On every exit path the waiter leaves the queue and an admitted-but-abandoned
        request is aborted, so no slot leaks.
        """
        assert self._loop is not None, "AdmissionQueue.start() was not called"
        if self._policy.is_full():
            # the driver may not have run since the last arrivals: give its round a chance first
            # (same loop thread, same policy, so still one admitter in effect)
            self._policy.admit_round(self._try_admit)
            if self._policy.is_full():
                raise QueueFull
        waiter = Waiter(request_id, prompt_token_ids, params, self._loop.create_future())
        self._policy.push(waiter)
        if on_queued is not None:
            on_queued()
        self.signal_capacity()
        gone = asyncio.ensure_future(client_gone())
        admitted = False
        try:
            await asyncio.wait(
                {waiter.future, gone}, timeout=self.queue_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter.future.done() and not gone.done():
                admitted = True
                return waiter.future.result(), time.monotonic() - waiter.enqueued_at_s
            raise ClientGone if gone.done() else QueueTimeout
        finally:
            gone.cancel()
            if not admitted:
                self._policy.remove(waiter)
                if waiter.future.done():  # admitted just as we gave up (or were cancelled): no slot leak
                    self._engine.abort(request_id, "client_gone")
                else:
                    waiter.future.cancel()
