"""The front of a multi-model server: it reads a generation request's `model`, has the model cache load
it if needed, and hands the request to that model's lane.

A lane is exactly a single-model server's app and state (admission queue, door, body guard, routes,
metrics) over one loaded model's engine, so a request to a resident model takes the same path as on a
single-model server; only the wait for a load is added in front of it. Waiting for a load never blocks
the event loop: loads run on the cache's worker (docs/serving.md, "Multi-model mode").

A request naming a LoRA adapter goes to its base's lane (the cache's `base_of`), loading the base as any
request for a cold model does; the lane serves the adapter as a single-model server serves its --lora ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from functools import partial

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from flotilla_server.engine.messages import LoadAdapter, UnloadAdapter
from flotilla_server.http.app import create_app, start_serving, stop_serving
from flotilla_server.http.door import DRAINING, GENERATION_PATHS
from flotilla_server.http.errors import error_body
from flotilla_server.http.metrics import StateSnapshot
from flotilla_server.http.pool_metrics import PoolMetrics
from flotilla_server.http.refusals import retry_after_s
from flotilla_server.http.serve import build_state
from flotilla_server.http.settings import ServerSettings
from flotilla_server.http.shedder import answer
from flotilla_server.http.state import ServedModel, ServerState
from flotilla_server.model_cache.cache import ModelCache
from flotilla_server.model_cache.engines import ModelEngine
from flotilla_server.model_cache.status import Infeasible, LoadFailed, LoadTimeout, UnknownModel

log = logging.getLogger("flotilla.server")

_EVICT_HANDOFF_S = 10.0  # the load worker waits this long for the loop to drop an evicted model's lane
_EMPTY = StateSnapshot(0, 0, 0, 0, 0, 0)


@dataclass(eq=False)
class Lane:
    handle: ModelEngine
    state: ServerState
    app: FastAPI


class FrontRefusal(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.headers = status, message, code, param, headers or {}


class PoolFront:
    def __init__(self, cache: ModelCache, settings: ServerSettings) -> None:
        self.cache = cache
        self.settings = settings
        self.metrics = PoolMetrics(cache.status, cache.list_status)
        self.lanes: dict[str, Lane] = {}
        self.routes: FastAPI | None = None  # the non-generation endpoints (pool_routes.create_pool_app)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = False
        self.in_flight = 0
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    # --- drain (serve.Drainable) ----------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        for lane in list(self.lanes.values()):
            lane.state.draining = value

    @property
    def accepting(self) -> bool:
        return self.ready and not self._draining

    async def wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def cut_off(self, reason: str) -> None:
        for lane in list(self.lanes.values()):
            lane.state.cut_off(reason)

    # --- lanes ----------------------------------------------------------------------------------

    def _snapshot(self, name: str) -> StateSnapshot:
        lane = self.lanes.get(name)
        return lane.state.snapshot() if lane is not None else _EMPTY

    def lane(self, handle: ModelEngine) -> Lane:
        """On the loop: the lane over this handle's engine, made when the model was (re)loaded."""
        lane = self.lanes.get(handle.name)
        if lane is not None and lane.handle is handle:
            return lane
        s = self.settings
        state = build_state(s, handle.engine, ServedModel(
            name=handle.name, tokenizer=handle.tokenizer, vocab_size=handle.vocab_size,
            max_model_len=handle.max_model_len, description=handle.description,
            is_demonstration=handle.is_demonstration, weight_bytes=handle.weight_bytes,
            quantization=handle.quantization))
        state.metrics = self.metrics.for_model(handle.name, partial(self._snapshot, handle.name))
        state.draining = self._draining
        lane = self.lanes[handle.name] = Lane(handle, state, create_app(state, s.max_body_bytes))
        start_serving(state)
        return lane

    def evicting(self, name: str) -> None:
        """Cache hook, on the load worker: drop the model's lane on the loop, and wait until it is dropped."""
        self.metrics.evictions.labels(name).inc()
        if self.loop is None or self.loop.is_closed():
            self.lanes.pop(name, None)
            return
        done = threading.Event()

        async def drop() -> None:
            try:
                lane = self.lanes.pop(name, None)
                if lane is not None:
                    await stop_serving(lane.state)
            finally:
                done.set()

        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(drop()))  # type: ignore[union-attr]
        if not done.wait(_EVICT_HANDOFF_S):
            log.warning("model %s: its lane was not dropped within %.0f s; unloading anyway", name, _EVICT_HANDOFF_S)

    def engine_died(self, name: str) -> None:
        """Cache hook, on the dead engine's thread: count it, and drop the model's lane (its requests have
        failed; a reload makes a new lane)."""
        self.metrics.engine_deaths.labels(name).inc()
        loop = self.loop
        if loop is None or loop.is_closed():
            self.lanes.pop(name, None)
            return

        async def drop() -> None:
            lane = self.lanes.get(name)
            if lane is not None and not lane.handle.engine.alive:
                del self.lanes[name]
                await stop_serving(lane.state)

        loop.call_soon_threadsafe(lambda: loop.create_task(drop()))

    def adapters_changed(self, name: str, handle: ModelEngine, unloads: tuple[str, ...],
                         loads: tuple[tuple[str, str], ...]) -> None:
        """Cache hook, on the load worker: the model list changed a loaded model's adapters; its engine is told
        on the loop (engine/adapter_service.py reads a loaded adapter on a thread of its own), without waiting."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(_change_adapters(name, handle, unloads, loads), loop)

    # --- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            assert self.routes is not None
            await self.routes(scope, receive, send)
            return
        if self._draining:
            await answer(send, DRAINING.status, DRAINING.body, DRAINING.headers)
            return
        self.in_flight += 1
        self._idle.clear()
        try:
            await self._generate(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.loop = asyncio.get_running_loop()
                self.cache.start()
                self.ready = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.ready = False
                for lane in list(self.lanes.values()):
                    await stop_serving(lane.state)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await self._read_body(receive)
            model = _model_of(body)
        except FrontRefusal as e:
            await _refuse(send, e)
            return
        name = self.cache.base_of(model) or model  # an adapter is served by its base's engine
        try:
            handle = await self._acquire_while_connected(name, receive)
        except FrontRefusal as e:
            await _refuse(send, e)
            return
        try:
            self.metrics.requests.labels(name, "routed").inc()
            await self.lane(handle).app(scope, _replay(body, receive), send)
        finally:
            self.cache.release(name)

    async def _acquire_while_connected(self, name: str, receive: Receive) -> ModelEngine:
        """The model's engine; a client that leaves while its model loads gives up its claim at once (499),
        so a model nobody waits for any more is not held busy."""
        if self.cache.is_loaded(name):  # the common path: no watcher task
            return await self._acquire(name)
        acquire = asyncio.ensure_future(self._acquire(name))
        gone = asyncio.ensure_future(receive())  # after the whole body, the next message is the disconnect
        await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
        if acquire.done():
            gone.cancel()
            return acquire.result()
        acquire.cancel()  # cache.acquire gives the claim back when cancelled
        with contextlib.suppress(asyncio.CancelledError, FrontRefusal):
            await acquire
        if not acquire.cancelled() and acquire.exception() is None:
            self.cache.release(name)  # the load finished as the client left
        self.metrics.requests.labels(name, "client_gone").inc()
        raise FrontRefusal(499, "Client closed the request.", "client_gone")

    async def preload(self, name: str) -> None:
        """Load `name` as its first request would, and let go (POST MODEL_LOAD_PATH): the operator moving an
        adaptive model into the pool has it loaded before the gateway sends the pool its traffic. Raises
        FrontRefusal as a request's load would."""
        handle = await self._acquire(name)
        try:
            self.lane(handle)
        finally:
            self.cache.release(name)

    async def _acquire(self, name: str) -> ModelEngine:
        s, cache = self.settings, self.cache
        try:
            return await cache.acquire(name, s.load_timeout_s)
        except UnknownModel:
            self.metrics.requests.labels("", "unknown_model").inc()
            if (skipped := cache.skipped_reason(name)) is not None:
                raise FrontRefusal(404, f"The model {name!r} is listed but not served: {skipped}.",
                                   "model_not_found", "model") from None
            raise FrontRefusal(404, f"The model {name!r} does not exist here: this server serves "
                                    f"{', '.join(sorted(cache.names()))} (see GET /v1/models).",
                               "model_not_found", "model") from None
        except Infeasible:
            self.metrics.requests.labels(name, "infeasible").inc()
            raise FrontRefusal(400, f"The model {name!r} needs {cache.footprint_bytes(name)} bytes (weights and KV "
                                    f"pool), more than this server's whole memory budget ({cache.budget_bytes} "
                                    "bytes): raise --memory-budget, lower --kv-cache-memory, or serve it on a larger "
                                    "device.", "model_too_large", "model") from None
        except LoadTimeout:
            self.metrics.requests.labels(name, "load_timeout").inc()
            retry_s = retry_after_s(s.load_timeout_s)
            raise FrontRefusal(503, f"The model {name!r} did not finish loading within {s.load_timeout_s:g} s "
                                    f"(--load-timeout-s): retry after {retry_s} s or send to another replica.",
                               "model_loading", headers={"Retry-After": str(retry_s)}) from None
        except LoadFailed as e:
            self.metrics.requests.labels(name, "load_failed").inc()
            raise FrontRefusal(503, f"{e}: check the model's source in the server's model list.",
                               "model_load_failed") from None

    async def _read_body(self, receive: Receive) -> bytes:
        limit, chunks, size = self.settings.max_body_bytes, [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise FrontRefusal(499, "Client closed the request.", "client_gone")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise FrontRefusal(413, f"The request body is larger than {limit} bytes (--max-body-bytes): "
                                        "send a smaller body.", "body_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _change_adapters(name: str, handle: ModelEngine, unloads: tuple[str, ...],
                           loads: tuple[tuple[str, str], ...]) -> None:
    """Unloads first (an adapter whose source changed is read again), then loads; a refusal is logged, and the
    adapter's requests get the lane's 404 until the list changes it again."""
    for adapter in unloads:
        reply = await handle.engine.adapter_call(UnloadAdapter(uuid.uuid4().hex, adapter))
        if reply.status not in (200, 404):
            log.error("model %s: adapter %s was not unloaded: %s", name, adapter, reply.message)
    for adapter, source in loads:
        reply = await handle.engine.adapter_call(LoadAdapter(uuid.uuid4().hex, adapter, source))
        if reply.status == 200:
            log.info("model %s: adapter %s loaded from %s", name, adapter, source)
        else:
            log.error("model %s: adapter %s (%s) is not served: %s", name, adapter, source, reply.message)


def _model_of(body: bytes) -> str:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        model = None
    if not isinstance(model, str) or not model:
        raise FrontRefusal(400, "The body must be a JSON object with a `model` field naming the model to use "
                                "(see GET /v1/models).", "invalid_request", "model")
    return model


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body once, as one message; then the client's own messages (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Send, e: FrontRefusal) -> None:
    await answer(send, e.status, json.dumps(error_body(e.status, e.message, e.param, e.code)).encode(),
                 tuple((k.lower().encode(), v.encode()) for k, v in e.headers.items()))
