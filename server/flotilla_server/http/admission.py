"""The HTTP side of admission: an exact count of requests not yet admitted, and each one's wait budget.

The queue itself and its policy (FIFO by ticket, bounded overtaking) run in the engine, next to the state
they decide on (engine/loop.py). Here ``AdmissionQueue.admit`` answers a full queue with 429 at once, from
its own exact count (no round trip to the engine), then waits for the engine's admission beside a timer and
the client's disconnect, so that a spent budget (429 ``queue_timeout``) and a client that left (499
``client_gone``) stay distinct. Every exit that is not an admission withdraws the request from the engine.

Classes and tenants (docs/serving.md, "Priorities and tenants"): each class has its own wait budget; batch
requests may fill the queue only up to its interactive reserve (the reserved slots' share of the queue), so
a batch flood never turns an interactive request away; a tenant with `tenant_max_queued` requests waiting
gets 429 ``tenant_limit``. The counts by class and tenant are exact, like the total.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from flotilla_contract.classes import BATCH, REQUEST_CLASSES

from flotilla_server.engine.client import RequestStream
from flotilla_server.engine.sampling_params import SamplingParams


class Engine(Protocol):
    """What admission needs of the engine client (flotilla_server.engine.client.EngineClient)."""

    def submit(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
               loop: asyncio.AbstractEventLoop, extra_prompts: Sequence[Sequence[int]] = ()) -> RequestStream: ...

    def abort(self, request_id: str, reason: str) -> None: ...


class QueueFull(Exception):
    """The queue holds queue_depth_per_slot × max_num_seqs waiters already."""


class QueueTimeout(Exception):
    """The request waited longer than queue_timeout_s."""


class ClientGone(Exception):
    """The client disconnected while its request waited."""


class TenantLimit(Exception):
    """The request's tenant has tenant_max_queued requests waiting already."""


class AdmissionQueue:
    def __init__(self, engine: Engine, *, depth: int, queue_timeout_s: float,
                 class_timeouts_s: Mapping[str, float] | None = None, batch_depth: int | None = None,
                 tenant_max_queued: int | None = None) -> None:
        if depth < 0:
            raise ValueError(f"queue depth must be >= 0, got {depth}")
        self._engine = engine
        self.depth = depth
        self.queue_timeout_s = queue_timeout_s
        self.class_timeouts_s = dict(class_timeouts_s or {})
        self.batch_depth = depth if batch_depth is None else min(depth, batch_depth)  # places batch may hold
        self.tenant_max_queued = tenant_max_queued
        self._waiting = 0  # submitted to the engine, not yet admitted, not given up: exact, on the loop thread
        self._by_class: Counter[str] = Counter(dict.fromkeys(REQUEST_CLASSES, 0))
        self._by_tenant: Counter[str] = Counter()

    def __len__(self) -> int:
        return self._waiting

    def is_full(self) -> bool:
        return self._waiting >= self.depth

    def batch_is_full(self) -> bool:
        """Batch requests hold their share of the queue."""
        return self._by_class[BATCH] >= self.batch_depth

    def tenant_is_full(self, tenant: str) -> bool:
        return self.tenant_max_queued is not None and self._by_tenant[tenant] >= self.tenant_max_queued

    def timeout_s(self, request_class: str) -> float:
        """The wait budget of a request of this class."""
        return self.class_timeouts_s.get(request_class, self.queue_timeout_s)

    def waiting_by_class(self) -> dict[str, int]:
        return dict(self._by_class)

    async def admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        client_gone: Callable[[], Awaitable[None]],
        on_queued: Callable[[], None] | None = None,
        extra_prompts: Sequence[Sequence[int]] = (),
    ) -> tuple[RequestStream, float]:
        """Wait for admission; return (the engine's stream, seconds waited).

        Raises QueueFull or TenantLimit at once, QueueTimeout after the class's wait budget, ClientGone if
        ``client_gone()`` completes first, ValueError if the engine could never run it. On every exit but
        admission the request is withdrawn from the engine, so no slot leaks.
        """
        request_class, tenant = params.request_class, params.tenant
        if self.is_full() or (params.is_batch and self.batch_is_full()):
            raise QueueFull
        if self.tenant_is_full(tenant):
            raise TenantLimit
        enqueued_at_s = time.monotonic()
        stream = self._engine.submit(request_id, prompt_token_ids, params, asyncio.get_running_loop(), extra_prompts)
        self._waiting += 1
        self._by_class[request_class] += 1
        self._by_tenant[tenant] += 1
        if on_queued is not None:
            on_queued()
        gone = asyncio.ensure_future(client_gone())
        admitted = False
        try:
            await asyncio.wait({stream.admitted, gone}, timeout=self.timeout_s(request_class),
                               return_when=asyncio.FIRST_COMPLETED)
            if stream.admitted.done() and not gone.done():
                admitted = True
                return stream, time.monotonic() - enqueued_at_s
            raise ClientGone if gone.done() else QueueTimeout
        finally:
            self._waiting -= 1
            self._by_class[request_class] -= 1
            self._by_tenant[tenant] -= 1
            if not self._by_tenant[tenant]:
                del self._by_tenant[tenant]
            gone.cancel()
            if not admitted:  # given up (or cancelled), even if admitted in the same instant: no slot leak
                self._engine.abort(request_id, "client_gone" if gone.done() else "queue_timeout")
