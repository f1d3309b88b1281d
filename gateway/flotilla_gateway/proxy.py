"""Sends a request to a pod and streams the answer back, unbuffered.

Rules (docs/gateway.md, "Passing through"):
- retries happen only before the first byte reaches the client, at most MAX_RETRIES times, each to a pod
  not tried yet: on connect errors, on 502/503/504, and on a pod's 429 when another pod has room;
- once the status line is passed on, bytes are forwarded as they arrive and never retried;
- a client that leaves closes the upstream connection, so the server cancels the request and frees its KV;
- a pooled model's pod is chosen among its residency tier's pods (residency.place), then by its policy;
- a request for a LoRA adapter goes to a pod whose report serves it (any of the model's pods when none has
  reported it yet: the adapter was known before they started), chosen by adapter_routing.choose_for_adapter
  (within the residency tier of its base, for a pooled base) instead of the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from flotilla_contract.load import PREFIX_KEY_HEADER
from starlette.types import Receive, Scope, Send

from flotilla_gateway.adapter_routing import choose_for_adapter
from flotilla_gateway.errors import GatewayError
from flotilla_gateway.load_board import LoadBoard
from flotilla_gateway.metrics import GatewayMetrics
from flotilla_gateway.residency import place
from flotilla_gateway.route_map import ModelRoute
from flotilla_gateway.routing import PodView, Policy, choose, prefix_key_name, retry_has_room

MAX_RETRIES = 2
RETRY_STATUSES = (502, 503, 504)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})


@dataclass
class Outcome:
    """What the access log and metrics record of one proxied request."""

    pod: str = ""
    attempts: int = 0
    status: int = 0
    first_byte_s: float | None = None
    tried: set[str] = field(default_factory=set)


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, board: LoadBoard, metrics: GatewayMetrics,
                 on_finish: Callable[[], None], connect_timeout_s: float = 5.0) -> None:
        self.session = session
        self.board = board
        self.metrics = metrics
        self.on_finish = on_finish  # a pod's in-flight count fell: held requests may go
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        self.pressed_since: dict[tuple[str, str], float] = {}  # pooled model → when its waiting per copy passed target

    def _pick(self, route: ModelRoute, key: str, name: str, policy: Policy, tried: set[str],
              adapter: str | None = None) -> str | None:
        started = time.perf_counter()
        untried = [p for p in route.pods if p not in tried]
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
                      policy: Policy, outcome: Outcome, on_done: Callable[[], None], adapter: str | None = None) -> Relay:
        """The pod's response, streaming; GatewayError when no pod could answer. `on_done` runs once the
        stream ends, however it ends. The first pod is picked before the first await (see activator). `key`:
        the routing key; the servers know it by its name (PREFIX_KEY_HEADER). `adapter`: the LoRA adapter
        the request names, if it names one (`route` is then its model's)."""
        last_error, retry_reason = "no ready pod", ""
        name = prefix_key_name(key)
        headers = {**headers, PREFIX_KEY_HEADER: name}
        while outcome.attempts <= MAX_RETRIES:
            address = self._pick(route, key, name, policy, outcome.tried, adapter)
            if address is None:
                break
            if retry_reason:  # counted when the retry really goes out
                self.metrics.retries.labels(route.name, route.namespace, retry_reason).inc()
            outcome.attempts += 1
            outcome.tried.add(address)
            outcome.pod = address
            self.board.in_flight[address] = self.board.in_flight.get(address, 0) + 1
            if policy == "prefix":
                self.board.note_sent(name, address)
            if adapter is not None:
                self.board.adapter_sent(adapter, address)
            started = time.monotonic()
            try:
                upstream = await self.session.post(f"http://{address}{path}", data=body, headers=headers,
                                                   timeout=self.timeout, auto_decompress=False)
            except (aiohttp.ClientConnectionError, TimeoutError, OSError) as error:
                self._release(address, adapter)
                last_error, retry_reason = f"{address} unreachable ({type(error).__name__})", "connect_error"
                continue
            except BaseException:
                self._release(address, adapter)
                raise
            retry = upstream.status in RETRY_STATUSES or (
                upstream.status == 429 and retry_has_room(self.board.views(route.pods), outcome.tried))
            if retry and outcome.attempts <= MAX_RETRIES and len(outcome.tried) < len(route.pods):
                upstream.close()
                self._release(address, adapter)
                last_error, retry_reason = f"{address} answered {upstream.status}", str(upstream.status)
                continue
            outcome.status = upstream.status
            outcome.first_byte_s = time.monotonic() - started

            def finish(address: str = address) -> None:
                self._release(address, adapter)
                on_done()

            return Relay(upstream, outcome, finish)
        raise GatewayError(502, f"No pod of the model {route.name!r} could take the request ({last_error}, "
                                f"{outcome.attempts} attempts): retry shortly.", code="upstream_unavailable",
                           headers={"Retry-After": "1"})

    def _release(self, address: str, adapter: str | None = None) -> None:
        if adapter is not None:
            self.board.adapter_done(adapter)
        left = self.board.in_flight.get(address, 1) - 1
        if left > 0:
            self.board.in_flight[address] = left
        else:
            self.board.in_flight.pop(address, None)
        self.on_finish()


class Relay:
    """An ASGI response that forwards the pod's status, headers and bytes as they arrive. It watches the
    client at the same time: a client that leaves closes the upstream connection at once, even while the
    pod sends nothing (the server then cancels the request and frees its KV)."""

    def __init__(self, upstream: aiohttp.ClientResponse, outcome: Outcome, on_close: Callable[[], None]) -> None:
        self.upstream = upstream
        self.outcome = outcome
        self.on_close = on_close
        self.status_code = upstream.status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.upstream.headers.items()
                   if k.lower() not in HOP_BY_HOP]
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
            self.on_close()

    async def _relay(self, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
        await send({"type": "http.response.start", "status": self.upstream.status, "headers": headers})
        with contextlib.suppress(aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            async for chunk in self.upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _watch(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
