"""The gateway's HTTP surface and the request path: read, authenticate, look up, hold or route, relay.

Each step is a module of its own (body_guard, keys, route_map, hold_policy, activator, routing, proxy);
this one wires them into a Starlette app, with probes, /metrics and GET /v1/models. A `model` that names no
model but a LoRA adapter the fleet serves (adapter_index.py, from the load reports) routes to its model's
pods by adapter_routing.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from flotilla_contract.flags import DEFAULT_MAX_BODY_BYTES
from flotilla_contract.labels import CLASS_HEADER, TENANT_HEADER
from flotilla_contract.load import PREFIX_KEY_HEADER
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from flotilla_gateway.access_log import log_request
from flotilla_gateway.activator import Activator, refusal
from flotilla_gateway.adapter_index import adapter_bases, model_cards
from flotilla_gateway.body_guard import read_body
from flotilla_gateway.ejection import EjectionPolicy, Ejector
from flotilla_gateway.errors import GatewayError, error_response
from flotilla_gateway.failover import RetryPolicy
from flotilla_gateway.hold_policy import admit, wakes_again
from flotilla_gateway.keys import Tenant, authenticate, authorize
from flotilla_gateway.keys_file import KeysFile, Reload
from flotilla_gateway.kube import KubeClient
from flotilla_gateway.load_board import DEFAULT_POLL_INTERVAL_S, LoadBoard
from flotilla_gateway.metrics import GatewayMetrics
from flotilla_gateway.proxy import HOP_BY_HOP, Outcome, Proxy
from flotilla_gateway.rate_limit_gate import NO_CHARGE, RateLimits
from flotilla_gateway.route_map import ModelRoute
from flotilla_gateway.routing import default_policy, routing_key
from flotilla_gateway.upstream import UpstreamClient
from flotilla_gateway.waker import Waker
from flotilla_gateway.watcher import RouteWatcher

STARTUP_WAIT_S = 10.0  # a request arriving before the first listing waits this long for it
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
NO_TENANT = "-"
DEFAULT_KEYS_RELOAD_INTERVAL_S = 10.0

log = logging.getLogger("flotilla_gateway.keys")


@dataclass
class GatewaySettings:
    namespaces: list[str] | None = None  # None: every namespace
    kubeconfig: str | None = None
    in_cluster: bool = False
    keys: KeysFile | None = None  # None: no API keys
    keys_reload_interval_s: float = DEFAULT_KEYS_RELOAD_INTERVAL_S  # how often the keys file is read again
    rate_limit_replicas: int = 1  # each replica enforces 1/N of every key's rate limits (--rate-limit-replicas)
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    connect_timeout_s: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # --max-retries, --retry-deadline-s
    ejection: EjectionPolicy = field(default_factory=EjectionPolicy)  # --eject-after-failures, --eject-base-s
    # with keys on, a client's cache_salt is always replaced by its tenant; salt_by_tenant also adds it when
    # absent, which needs servers that accept `cache_salt` (prefix caching)
    salt_by_tenant: bool = False
    # the key every model's servers were started with (flotilla-server --api-key): sent upstream in place
    # of whatever Authorization the client sent; None sends the client's own (when keys are off)
    upstream_api_key: str | None = field(default=None, repr=False)


class Gateway:
    def __init__(self, settings: GatewaySettings, kube: KubeClient | None = None) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.board = LoadBoard(settings.poll_interval_s)
        self.kube = kube
        self.watcher: RouteWatcher | None = None
        self.activator = Activator(self.board, self.metrics, lambda: self.routes)
        self.waker = Waker(kube, self.metrics)
        self.proxy: Proxy | None = None
        self.session: aiohttp.ClientSession | None = None
        self.adapters: dict[str, str] = {}  # adapter name → its model's name (adapter_index.adapter_bases)
        self.rate_limits = RateLimits(self.metrics.rate_limited, settings.rate_limit_replicas)
        self.stopping = False  # SIGTERM seen: not ready, but routing until the drain delay ends (cli.py)
        if settings.keys is not None:
            self.metrics.keys_loaded_at.set(settings.keys.loaded_at_s)

    @property
    def routes(self) -> dict[str, ModelRoute]:
        return self.watcher.routes if self.watcher is not None else {}

    @property
    def ready(self) -> bool:
        return (self.watcher is not None and self.watcher.listed.is_set() and not self.activator.draining
                and not self.stopping)

    def drain(self) -> None:
        self.activator.drain()

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Starlette) -> AsyncIterator[None]:
        if self.kube is None:
            self.kube = KubeClient(self.settings.kubeconfig, self.settings.in_cluster)
            self.waker.kube = self.kube
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        client = UpstreamClient(self.settings.connect_timeout_s)
        self.proxy = Proxy(client, self.board, self.metrics, self.activator.pump,
                           self.settings.connect_timeout_s, self.settings.retry, Ejector(self.settings.ejection),
                           live_pods=lambda route: self.routes.get(route.name, route).pods)
        self.watcher = RouteWatcher(self.kube, self.settings.namespaces, self._on_routes)
        self.watcher.start()
        self.board.start(self.session, self._pods, self._on_load)
        keys_task = asyncio.create_task(self._reload_keys()) if self.settings.keys is not None else None
        try:
            yield
        finally:
            if keys_task is not None:
                keys_task.cancel()
            self.activator.drain()
            await self.watcher.stop()
            await self.board.stop()
            await self.waker.stop()
            client.close()
            await self.session.close()
            await self.kube.close()

    async def _reload_keys(self) -> None:
        keys = self.settings.keys
        assert keys is not None
        while True:
            await asyncio.sleep(self.settings.keys_reload_interval_s)
            try:
                outcome = keys.reload()
            except Exception:  # a bug must not end the reloads; the last good keys stay in force
                log.exception("reading the keys file %s failed; the last good keys stay in force", keys.path)
                self.metrics.keys_reload_failures.inc()
                continue
            if outcome is Reload.LOADED:
                self.metrics.keys_loaded_at.set(keys.loaded_at_s)
                log.info("reloaded the keys file %s: %d keys", keys.path, len(keys.keys))
            elif outcome is Reload.REFUSED:
                self.metrics.keys_reload_failures.inc()
                log.error("refused a new version of the keys file, the last good keys stay in force: %s",
                          keys.refusal)

    def _pods(self) -> set[str]:
        return {p for route in self.routes.values() for p in route.pods}

    def _learn_adapters(self) -> None:
        self.adapters = adapter_bases(self.routes, self.board.reported_adapters(), self.adapters)

    def _on_routes(self) -> None:
        self._learn_adapters()
        if self.proxy is not None:
            self.proxy.ejector.forget(self._pods())
        for route in self.routes.values():
            self.metrics.known(route)
            if wakes_again(route, self.activator.held(route)):
                self.waker.wake(route)  # once per generation of what it wakes
        self.activator.pump()

    def _on_load(self) -> None:
        self._learn_adapters()
        for route in self.routes.values():
            for view in self.board.views(route.pods):
                for figure, value in (("in_flight", view.in_flight), ("waiting", view.waiting),
                                      ("running", view.running), ("kv_usage", view.kv_usage),
                                      ("age_seconds", view.load_age_s if view.load_age_s is not None else -1)):
                    self.metrics.pod_load.labels(route.name, route.namespace, view.address, figure).set(value)
        self.activator.pump()
        self.activator.refresh_gauges()

    # -- the request path ----------------------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        started = time.monotonic()
        endpoint = ENDPOINTS[request.url.path]
        model, namespace, tenant, held_s, base = "", "", NO_TENANT, 0.0, None
        outcome = Outcome()
        charge = NO_CHARGE  # the key's rate-limit reservation: settled however the request ends
        try:
            raw, body = await read_body(request, self.settings.max_body_bytes)
            model = body["model"]
            tenant_of_key = None
            if self.settings.keys is not None:
                tenant_of_key = authenticate(self.settings.keys.keys, request.headers.get("authorization"))
                tenant = tenant_of_key.name
                authorize(tenant_of_key, model)
                charge = self.rate_limits.admit(tenant_of_key, body)  # or 429
            else:
                tenant = request.headers.get(TENANT_HEADER) or NO_TENANT
            route = await self._route(model)
            namespace = route.namespace
            adapter = model if route.name != model else None
            base = route.name if adapter is not None else None
            admission = admit(route, self.activator.held(route), self.activator.draining)
            if admission.action == "refuse":
                raise refusal(admission)
            if admission.action == "hold":
                if admission.wake:
                    self.waker.wake(route)
                gone = asyncio.ensure_future(_disconnected(request))
                try:
                    held_s = await self.activator.hold(route, gone)
                finally:
                    gone.cancel()
                route = self.routes.get(route.name, route)
            headers = _upstream_headers(request, tenant_of_key, self.settings.upstream_api_key)
            if tenant_of_key is not None and ("cache_salt" in body or self.settings.salt_by_tenant):
                body["cache_salt"] = tenant_of_key.name  # one tenant cannot probe another's prefix cache
                raw = json.dumps(body).encode()
            assert self.proxy is not None
            policy = default_policy(endpoint, route.policy)
            key = routing_key(model, endpoint, body)

            def done() -> None:
                self._finish(request, model, namespace, tenant, outcome.status, started, held_s, outcome, base=base)

            # the status line waits for the pod's first byte (proxy.py): a client that leaves meanwhile cancels
            forward = asyncio.ensure_future(self.proxy.forward(route, request.url.path, raw, headers, key, policy,
                                                               outcome, done, adapter, arrived_s=started,
                                                               weight=sequences(body)))
            gone = asyncio.ensure_future(_disconnected(request))
            try:
                await asyncio.wait((forward, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not forward.done():
                    forward.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await forward
            if forward.cancelled():
                raise GatewayError(499, "Client closed the request.", code="client_gone")
            return charge.metered(forward.result())
        except GatewayError as error:
            charge.settle()  # no answer: nothing used
            self._finish(request, model, namespace, tenant, error.status, started, held_s, outcome, error.code,
                         base)
            return error.response()

    async def _route(self, model: str) -> ModelRoute:
        assert self.watcher is not None
        if not self.watcher.listed.is_set():
            try:
                await asyncio.wait_for(self.watcher.listed.wait(), STARTUP_WAIT_S)
            except TimeoutError:
                raise GatewayError(503, "The gateway has not yet listed the fleet from the Kubernetes API: "
                                        "retry shortly.", code="starting", headers={"Retry-After": "1"}) from None
        route = self.routes.get(model)
        if route is None and model in self.adapters:
            route = self.routes.get(self.adapters[model])  # a LoRA adapter: its model's route
        if route is None:
            served = ", ".join(repr(n) for n in sorted(self.routes)) or "no model yet"
            raise GatewayError(404, f"The model {model!r} does not exist here: this gateway serves {served} "
                                    "(see GET /v1/models).", param="model", code="model_not_found")
        return route

    def _finish(self, request: Request, model: str, namespace: str, tenant: str, status: int, started: float,
                held_s: float, outcome: Outcome, code: str | None = None, base: str | None = None) -> None:
        """`base`: the model of the adapter `model` names, when it names one."""
        route_label = request.url.path
        self.metrics.count(self.metrics.model_label(model, base), namespace, status, route_label, tenant)
        log_request(method=request.method, path=route_label, status=status, model=model, base=base,
                    model_namespace=namespace, tenant=tenant, pod=outcome.pod or None, attempts=outcome.attempts,
                    held_s=round(held_s, 4), first_byte_s=outcome.first_byte_s and round(outcome.first_byte_s, 4),
                    duration_s=round(time.monotonic() - started, 4), code=code, stream_error=outcome.stream_error,
                    client=request.client.host if request.client else None)

    # -- the other endpoints --------------------------------------------------------------------------

    async def models(self, _: Request) -> Response:
        """Every model of the route map and every adapter the pods report, each once (adapters with `parent`)."""
        return JSONResponse({"object": "list", "data": model_cards(self.routes, self.adapters)})

    async def healthz(self, _: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, _: Request) -> Response:
        if self.ready:
            return JSONResponse({"status": "ready", "models": len(self.routes)})
        reason = "draining" if self.activator.draining or self.stopping else "listing the fleet"
        return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)

    async def metrics_endpoint(self, _: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def app(self) -> ASGIApp:
        """The generation routes go straight to `generate` (Starlette's routing and middleware wrap every chunk's
        send in three more calls); everything else, other methods on those paths too, through Starlette."""
        routes = [Route(path, self.generate, methods=["POST"]) for path in ENDPOINTS]
        routes += [Route("/v1/models", self.models, methods=["GET"]),
                   Route("/healthz", self.healthz, methods=["GET"]),
                   Route("/readyz", self.readyz, methods=["GET"]),
                   Route("/metrics", self.metrics_endpoint, methods=["GET"])]
        rest = Starlette(routes=routes, lifespan=self.lifespan, exception_handlers={HTTPException: _http_error})

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in ENDPOINTS:
                response = await self.generate(Request(scope, receive, send))
                await response(scope, receive, send)
            else:
                await rest(scope, receive, send)

        return app


def sequences(body: dict[str, Any]) -> int:
    """The sequences a request runs at once on its pod: its `n` (the server counts each as one in flight);
    1 when absent or not a positive whole number (the server then refuses it, naming the field)."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _upstream_headers(request: Request, tenant: Tenant | None, upstream_key: str | None) -> dict[str, str]:
    """The client's headers minus hop-by-hop ones; with keys on, the key's tenant replaces the client's
    tenant header (and the key's class, when it names one, the class header), and the key itself stays
    here. With an upstream key, the servers get it in place of the client's."""
    stripped = set(HOP_BY_HOP) | {"accept-encoding", PREFIX_KEY_HEADER.lower()}  # the gateway names prefixes
    if tenant is not None:
        stripped |= {"authorization", TENANT_HEADER.lower()}
        if tenant.request_class is not None:
            stripped.add(CLASS_HEADER.lower())
    if upstream_key is not None:
        stripped.add("authorization")
    headers: dict[str, Any] = {k: v for k, v in request.headers.items() if k.lower() not in stripped}
    if tenant is not None:
        headers[TENANT_HEADER] = tenant.name
        if tenant.request_class is not None:
            headers[CLASS_HEADER] = tenant.request_class
    if upstream_key is not None:
        headers["authorization"] = f"Bearer {upstream_key}"
    headers["content-type"] = "application/json"
    return headers


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = (f"No route {request.url.path}: the gateway serves POST /v1/chat/completions, "
                   "POST /v1/completions and GET /v1/models.")
    elif exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow")
        message = f"Method {request.method} is not allowed on {request.url.path}" + (f": use {allow}." if allow else ".")
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message, headers=exc.headers)
