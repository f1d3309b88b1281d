"""Sends a request to a pod and streams the answer back, unbuffered after its first byte.

Rules (docs/gateway.md, "Passing through" and "Failover"):
- the status line is held until the pod's first body byte: until then nothing has reached the client, and a
  failed attempt is retried on a pod not tried yet, as failover.decide_retry says (connect errors, a connection
  dropped before the first byte, 502, 503, the pod gone from the endpoints, a 429 when another pod has room),
  within --max-retries and --retry-deadline-s;
- once the first byte is passed on, bytes are forwarded as they arrive and never retried; a pod that fails
  mid-answer ends a streamed answer with an SSE error event in OpenAI's error shape (counted in
  flotilla_gateway_stream_errors_total), so a client never mistakes a cut stream for a finished one;
- a pod failing in a row is ejected for a cool-down (ejection.py), never more than half of a model's pods;
- a client that leaves closes the upstream connection, so the server cancels the request and frees its KV;
- a request with `n` choices counts as n in flight on its pod, as the server counts it;
- a pooled model's pod is chosen among its residency tier's pods (residency.place), then by its policy;
- a request for a LoRA adapter goes to a pod whose report serves it (any of the model's pods when none has
  reported it yet: the adapter was known before they started), chosen by adapter_routing.choose_for_adapter
  (within the residency tier of its base, for a pooled base) instead of the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flotilla_contract.load import PREFIX_KEY_HEADER
from starlette.types import Receive, Scope, Send

from flotilla_gateway.adapter_routing import choose_for_adapter
from flotilla_gateway.ejection import Ejector
from flotilla_gateway.errors import GatewayError
from flotilla_gateway.failover import (
    CONNECT_ERROR,
    DROPPED_BEFORE_BODY,
    POD_GONE,
    Attempt,
    RetryPolicy,
    decide_retry,
)
from flotilla_gateway.load_board import LoadBoard
from flotilla_gateway.metrics import GatewayMetrics
from flotilla_gateway.residency import place
from flotilla_gateway.route_map import ModelRoute
from flotilla_gateway.routing import PodView, Policy, choose, prefix_key_name, retry_has_room
from flotilla_gateway.upstream import Answer, UpstreamClient

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})
EJECTING_FAILURES = (CONNECT_ERROR, DROPPED_BEFORE_BODY, 502)  # what a healthy pod does not answer
GONE_CHECK_S = 0.25  # how often a wait for a first byte looks whether its pod left the endpoints
STREAM_ERROR_CAUSE = "upstream_dropped"


@dataclass
class Outcome:
    """What the access log and metrics record of one proxied request."""

    pod: str = ""
    attempts: int = 0
    status: int = 0
    first_byte_s: float | None = None
    tried: set[str] = field(default_factory=set)
    stream_error: str | None = None  # the cause, when the answer failed after its first byte


class Proxy:
    def __init__(self, client: UpstreamClient | None, board: LoadBoard, metrics: GatewayMetrics,
                 on_finish: Callable[[], None], connect_timeout_s: float = 5.0,
                 retry_policy: RetryPolicy | None = None, ejector: Ejector | None = None,
                 live_pods: Callable[[ModelRoute], tuple[str, ...]] | None = None) -> None:
        self.client = client or UpstreamClient(connect_timeout_s)
        self.board = board
        self.metrics = metrics
        self.on_finish = on_finish  # a pod's in-flight count fell: held requests may go
        self.retry_policy = retry_policy or RetryPolicy()
        self.ejector = ejector or Ejector()
        self.live_pods = live_pods or (lambda route: route.pods)  # the route's pods now (the watch updates them)
        self.pressed_since: dict[tuple[str, str], float] = {}  # pooled model → when its waiting per copy passed target

    def _pick(self, route: ModelRoute, key: str, name: str, policy: Policy, tried: set[str],
              adapter: str | None = None) -> str | None:
        started = time.perf_counter()
        untried = self._untried(route, tried)
        if adapter is not None:
            untried = self.board.adapter_servers(untried, adapter) or untried
        holders = self.board.holders(name) if policy == "prefix" and adapter is None else frozenset()
        if route.pool is None:
            views = self.board.views(untried)
            pod = choose(views, key, policy, holders) if adapter is None else self._choose_adapter(route, views, adapter)
        else:
            pod = self._pick_resident(route, untried, key, policy, holders, adapter)
        self.metrics.routing_seconds.labels(route.name, route.namespace, policy).observe(time.perf_counter() - started)
        return pod.address if pod is not None else None

    def _untried(self, route: ModelRoute, tried: set[str]) -> list[str]:
        """The route's pods in rotation not tried yet for this request."""
        return self.ejector.in_rotation((p for p in route.pods if p not in tried), time.monotonic())

    def _choose_adapter(self, route: ModelRoute, views: list[PodView] | tuple[PodView, ...],
                        adapter: str) -> PodView | None:
        addresses = [v.address for v in views]
        return choose_for_adapter(views, adapter, self.board.adapter_holders(adapter),
                                  self.board.adapter_in_flight.get(adapter, 0),
                                  self.board.adapter_free_slots(addresses, route.name))

    def _pick_resident(self, route: ModelRoute, addresses: list[str], key: str, policy: Policy,
                       holders: frozenset[str], adapter: str | None = None) -> PodView | None:
        """A pooled model: the residency tier first (loaded, loading, free budget, oldest LRU), then the policy
        (or, for an adapter of it, the adapter rule)."""
        if not addresses:
            return None
        model = (route.namespace, route.name)
        placement = place(self.board.residences(addresses, route.name), route.target_waiting,
                          self.pressed_since.get(model), time.monotonic())
        if placement.pressed_since_s is None:
            self.pressed_since.pop(model, None)
        else:
            self.pressed_since[model] = placement.pressed_since_s
        self.metrics.residency.labels(route.name, route.namespace, placement.tier).inc()
        if adapter is not None:
            return self._choose_adapter(route, placement.pods, adapter)
        return choose(placement.pods, key, policy, holders)

    async def forward(self, route: ModelRoute, path: str, body: bytes, headers: dict[str, str], key: str,
                      policy: Policy, outcome: Outcome, on_done: Callable[[], None], adapter: str | None = None,
                      arrived_s: float | None = None, weight: int = 1) -> Relay:
        """The pod's response, streaming from its first byte; GatewayError when no pod could answer. `on_done`
        runs once the stream ends, however it ends. The first pod is picked before the first await (see
        activator). `key`: the routing key; the servers know it by its name (PREFIX_KEY_HEADER). `adapter`:
        the LoRA adapter the request names, if it names one (`route` is then its model's). `arrived_s`: when
        the request reached the gateway (time.monotonic), for the retry deadline. `weight`: the request's
        sequences (its `n`), as the pod's in-flight count takes it."""
        arrived_s = time.monotonic() if arrived_s is None else arrived_s
        last_error, retry_reason = "no ready pod", ""
        name = prefix_key_name(key)
        headers = {**headers, PREFIX_KEY_HEADER: name}
        while True:
            address = self._pick(route, key, name, policy, outcome.tried, adapter)
            if address is None:
                break
            if retry_reason:  # counted when the retry really goes out
                self.metrics.retries.labels(route.name, route.namespace, retry_reason).inc()
            outcome.attempts += 1
            outcome.tried.add(address)
            outcome.pod = address
            self.board.in_flight[address] = self.board.in_flight.get(address, 0) + weight
            if policy == "prefix":
                self.board.note_sent(name, address)
            if adapter is not None:
                self.board.adapter_sent(adapter, address)
            started = time.monotonic()
            try:
                upstream, first, failure = await self._attempt(route, address, path, body, headers)
            except BaseException:
                self._release(address, adapter, weight)
                raise
            if failure == 0 and upstream is not None:  # the first byte came: the answer is this pod's
                return self._relay(route, upstream, first, outcome, started, address, adapter, weight, on_done)
            untried = self._untried(route, outcome.tried)
            room = failure == 429 and retry_has_room(self.board.views(untried), outcome.tried)
            verdict = decide_retry(Attempt(failure, outcome.attempts - 1, time.monotonic() - arrived_s,
                                           len(untried), room), self.retry_policy)
            if failure in EJECTING_FAILURES and self.ejector.failed(address, route.pods, time.monotonic()):
                self.metrics.ejections.labels(route.name, route.namespace, address).inc()
            self._count_ejected(route)
            if isinstance(failure, int) and upstream is not None and not verdict.retry:
                # the pod's own answer (a 4xx, a 5xx it chose, or a retryable one with no retry left) goes back
                return self._relay(route, upstream, b"", outcome, started, address, adapter, weight, on_done)
            if upstream is not None:
                upstream.close()
            self._release(address, adapter, weight)
            last_error = f"{address} " + (f"answered {failure}" if isinstance(failure, int) else failure.replace("_", " "))
            if not verdict.retry:
                break
            retry_reason = verdict.reason
        raise GatewayError(502, f"No pod of the model {route.name!r} could take the request ({last_error}, "
                                f"{outcome.attempts} attempts): retry shortly.", code="upstream_unavailable",
                           headers={"Retry-After": "1"})

    async def _attempt(self, route: ModelRoute, address: str, path: str, body: bytes, headers: dict[str, str]
                       ) -> tuple[Answer | None, bytes, str | int]:
        """One attempt on `address`: (its response, its first body bytes, 0) once a first byte came; else the
        failure: a connect error, a connection dropped before the first byte, the pod's status code (its
        response, unread), or the pod gone from the endpoints while the gateway waited (the attempt is then
        cancelled, and its connection closed: the server cancels the request)."""
        task = asyncio.ensure_future(self._send(address, path, body, headers))
        try:
            while True:
                done, _ = await asyncio.wait((task,), timeout=GONE_CHECK_S)
                if done:
                    return task.result()
                if address not in self.live_pods(route):
                    return None, b"", POD_GONE
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _send(self, address: str, path: str, body: bytes, headers: dict[str, str]
                    ) -> tuple[Answer | None, bytes, str | int]:
        upstream = None
        try:
            upstream = await self.client.post(address, path, body, headers)
            if not 200 <= upstream.status < 300:
                return upstream, b"", upstream.status
            first = await upstream.read()
        except (TimeoutError, OSError):  # ConnectFailed, Dropped are ConnectionErrors
            if upstream is not None:
                upstream.close()
                return None, b"", DROPPED_BEFORE_BODY
            return None, b"", CONNECT_ERROR
        except BaseException:
            if upstream is not None:
                upstream.close()
            raise
        if not first:
            upstream.close()
            return None, b"", DROPPED_BEFORE_BODY
        return upstream, first, 0

    def _relay(self, route: ModelRoute, upstream: Answer, first: bytes, outcome: Outcome,
               started: float, address: str, adapter: str | None, weight: int, on_done: Callable[[], None]) -> Relay:
        outcome.status = upstream.status
        outcome.first_byte_s = time.monotonic() - started

        def finish(failed: bool) -> None:
            if failed:
                self.metrics.stream_errors.labels(route.name, route.namespace, STREAM_ERROR_CAUSE).inc()
                if self.ejector.failed(address, route.pods, time.monotonic()):
                    self.metrics.ejections.labels(route.name, route.namespace, address).inc()
                self._count_ejected(route)
            elif 200 <= upstream.status < 300:
                self.ejector.succeeded(address)
            self._release(address, adapter, weight)
            on_done()

        return Relay(upstream, outcome, finish, first)

    def _count_ejected(self, route: ModelRoute) -> None:
        now = time.monotonic()
        out = sum(1 for pod in route.pods if self.ejector.ejected(pod, now))
        self.metrics.ejected.labels(route.name, route.namespace).set(out)

    def _release(self, address: str, adapter: str | None = None, weight: int = 1) -> None:
        if adapter is not None:
            self.board.adapter_done(adapter)
        left = self.board.in_flight.get(address, weight) - weight
        if left > 0:
            self.board.in_flight[address] = left
        else:
            self.board.in_flight.pop(address, None)
        self.on_finish()


class Relay:
    """An ASGI response that forwards the pod's status, headers and bytes as they arrive (`first`: bytes already
    read while the status line was held). It watches the client at the same time: a client that leaves closes
    the upstream connection at once, even while the pod sends nothing (the server then cancels the request and
    frees its KV). A pod that fails mid-answer ends a streamed answer with an SSE error event."""

    def __init__(self, upstream: Answer, outcome: Outcome, on_close: Callable[[bool], None],
                 first: bytes = b"") -> None:
        self.upstream = upstream
        self.outcome = outcome
        self.on_close = on_close  # with True when the pod failed after the first byte
        self.first = first
        self.status_code = upstream.status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.upstream.headers
                   if k not in HOP_BY_HOP]
        relay = asyncio.create_task(self._relay(send, headers))
        watch = asyncio.create_task(self._watch(receive))
        try:
            await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
            if watch.done() and not relay.done():
                self.outcome.status = 499  # the client left mid-stream
        finally:
            for task in (relay, watch):
                task.cancel()
            for task in (relay, watch):
                with contextlib.suppress(BaseException):
                    await task
            self.upstream.close()
            self.on_close(self.outcome.stream_error is not None)

    async def _relay(self, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
        await send({"type": "http.response.start", "status": self.upstream.status, "headers": headers})
        if self.first:
            await send({"type": "http.response.body", "body": self.first, "more_body": True})
        read = self.upstream.read
        try:
            while chunk := await read():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError as error:  # upstream.Dropped: the pod's connection ended mid-answer
            self.outcome.stream_error = STREAM_ERROR_CAUSE
            if self.upstream.header("content-type").startswith("text/event-stream"):
                await send({"type": "http.response.body", "body": stream_error_event(error), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _watch(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass


def stream_error_event(error: BaseException) -> bytes:
    """The SSE event that ends a stream cut by its pod, in OpenAI's error shape (the `openai` client raises
    APIError on it rather than returning a short answer as if complete)."""
    body = {"error": {"message": f"The model server failed mid-answer ({type(error).__name__}); the answer is "
                                 "incomplete: send the request again.", "type": "server_error", "param": None,
                      "code": STREAM_ERROR_CAUSE}}
    return b"\n\ndata: " + json.dumps(body).encode() + b"\n\n"
