"""Holds requests for a model with no ready pod, wakes it, and releases them as its pods turn ready.

One FIFO queue per model, bounded by `spec.coldStart.maxHeld` (decided in hold_policy). A held request
waits at most `spec.coldStart.maxWaitSeconds`; `pump()` runs on every route, load and in-flight change and
releases no more than the ready pods' admission queues take. On drain every held request gets 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

from flotilla_gateway.errors import GatewayError
from flotilla_gateway.hold_policy import Admission, releasable, wait_spent
from flotilla_gateway.load_board import LoadBoard
from flotilla_gateway.metrics import GatewayMetrics
from flotilla_gateway.route_map import ModelRoute

Key = tuple[str, str]  # (namespace, served name)


def refusal(admission: Admission) -> GatewayError:
    headers = {"Retry-After": str(admission.retry_after_s)} if admission.retry_after_s is not None else None
    return GatewayError(admission.status, admission.message, code=admission.code, headers=headers)


class Activator:
    def __init__(self, board: LoadBoard, metrics: GatewayMetrics, routes: Callable[[], dict[str, ModelRoute]]) -> None:
        self.board = board
        self.metrics = metrics
        self.routes = routes
        self.queues: dict[Key, deque[asyncio.Future[None]]] = {}
        self.released: dict[Key, set[asyncio.Future[None]]] = {}  # released, not yet sent to a pod
        self.enqueued_at: dict[asyncio.Future[None], float] = {}  # monotonic time each held request came
        self.draining = False

    def held(self, route: ModelRoute) -> int:
        return len(self.queues.get((route.namespace, route.name), ()))

    async def hold(self, route: ModelRoute, client_gone: asyncio.Future[None] | None = None) -> float:
        """Wait until released; the seconds held. GatewayError 503 when maxWait is spent or on drain, 499
        when `client_gone` completes first. The caller must pick its pod before its next await: room was
        counted for it until this returns."""
        key = (route.namespace, route.name)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self.queues.setdefault(key, deque())
        queue.append(future)
        started = time.monotonic()
        self.enqueued_at[future] = started
        self._gauge(route, queue)
        try:
            self.pump()
            waits = {future} if client_gone is None else {future, client_gone}
            await asyncio.wait(waits, timeout=route.max_wait_s, return_when=asyncio.FIRST_COMPLETED)
            if not future.done():
                if client_gone is not None and client_gone.done():
                    raise GatewayError(499, "The client closed the connection while the request was held.")
                raise refusal(wait_spent(route))
            future.result()  # raises the drain's 503
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(future)  # still queued: timed out, cancelled (client left) or drained
            self.released.get(key, set()).discard(future)  # from here the pod's in-flight count has it
            self.enqueued_at.pop(future, None)
            if not queue and self.queues.get(key) is queue:
                del self.queues[key]
            self._gauge(route, queue)
            self.metrics.hold_seconds.labels(route.name, route.namespace).observe(time.monotonic() - started)
        return time.monotonic() - started

    def pump(self) -> None:
        """Release what the ready pods can take, oldest first."""
        if not self.queues:
            return
        routes = self.routes()
        for (namespace, name), queue in list(self.queues.items()):
            route = routes.get(name)
            if route is None or route.namespace != namespace or not route.pods:
                continue
            released = self.released.setdefault((namespace, name), set())
            # released requests not yet sent take room too, until they count in a pod's in-flight
            for _ in range(releasable(self.board.views(route.pods), len(queue) + len(released)) - len(released)):
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)
                    released.add(future)
            self._gauge(route, queue)

    def drain(self) -> None:
        """Refuse every held request with 503 and Retry-After; new requests are refused in hold_policy."""
        self.draining = True
        for queue in self.queues.values():
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_exception(GatewayError(
                        503, "This gateway is shutting down: retry, and another replica will answer.",
                        code="draining", headers={"Retry-After": "1"}))

    def _gauge(self, route: ModelRoute, queue: deque[asyncio.Future[None]]) -> None:
        self.metrics.held.labels(route.name, route.namespace).set(len(queue))
        oldest = min((self.enqueued_at.get(f, time.monotonic()) for f in queue), default=None)
        age_s = time.monotonic() - oldest if oldest is not None else 0.0
        self.metrics.oldest_held.labels(route.name, route.namespace).set(age_s)
        self.metrics.max_wait.labels(route.name, route.namespace).set(route.max_wait_s)

    def refresh_gauges(self) -> None:
        """Ages grow between events: the load poll calls this several times a second."""
        routes = self.routes()
        for (namespace, name), queue in self.queues.items():
            route = routes.get(name)
            if route is not None and route.namespace == namespace:
                self._gauge(route, queue)
