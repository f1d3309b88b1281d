"""Serve HTTP over a started engine, and drain on SIGTERM (the CLI loads the model and starts the engine).

Drain: the first SIGTERM (or SIGINT) turns /readyz to 503 and refuses new requests with 503 while the
listening socket stays open (a closed socket would look like a crash to clients and load balancers);
in-flight requests get --drain-timeout-s to finish, then uvicorn stops and the process exits 0.
A second signal cuts off what is still in flight at once, as the timeout would (each client is told, and
counted, as draining, never as gone), then exits 0; a third exits without waiting for anything.

If the engine dies, /readyz turns 503 at once (ServerState.accepting), the requests in flight end with an
engine_error, and the process exits 1 so that Kubernetes restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType
from typing import Protocol

import uvicorn

from flotilla_server.engine.client import EngineClient, EngineInfo
from flotilla_server.engine.startup_heap import freeze_startup_heap
from flotilla_server.http.admission import AdmissionQueue
from flotilla_server.http.app import create_app
from flotilla_server.http.bounded_protocol import EVENT_LOOP
from flotilla_server.http.door_protocol import door_protocol
from flotilla_server.http.front_share import FrontShare
from flotilla_server.http.settings import ServerSettings
from flotilla_server.http.state import ServedModel, ServerState
from flotilla_server.http.structured import StructuredSettings

log = logging.getLogger("flotilla.server")

_CUT_OFF_FLUSH_S = 0.5  # after a drain timeout, time for cut-off streams to send their last chunk
_ENGINE_DEATH_GRACE_S = 1.0  # after the engine died: /readyz answers 503 this long before the process exits


class Drainable(Protocol):
    """What draining needs of a server: ServerState (one model) or PoolFront (several)."""

    draining: bool
    in_flight: int

    async def wait_idle(self, timeout_s: float) -> bool: ...

    def cut_off(self, reason: str) -> None: ...


class DrainingServer(uvicorn.Server):
    """`signals_from_parent`: one of several HTTP processes, which drains on the SIGTERMs its parent forwards
    (flotilla_server/fronts.py) and ignores the SIGINT a terminal sends the whole process group."""

    def __init__(self, config: uvicorn.Config, state: Drainable, drain_timeout_s: float,
                 signals_from_parent: bool = False) -> None:
        super().__init__(config)
        self._signals_from_parent = signals_from_parent
        self._state = state
        self._drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self.drained_cleanly: bool | None = None
        self._cutting_off = False
        self.engine_died = False

    async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # never record the signal: uvicorn would re-raise it after shutdown and the exit status would be -15
        if self._signals_from_parent and sig == signal.SIGINT:
            return
        if self._loop is None or self._cutting_off:
            self.force_exit = self.should_exit = True
            return
        name = signal.Signals(sig).name
        if self._state.draining:
            log.warning("%s again: cutting off %d request(s) in flight now", name, self._state.in_flight)
            self._cutting_off = True
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._cut_off("shutdown")))  # type: ignore[union-attr]
            return
        self._state.draining = True
        log.info("%s", drain_started_message(name, self._state.in_flight, self._drain_timeout_s))
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain()))  # type: ignore[union-attr]

    async def _drain(self) -> None:
        self.drained_cleanly = await self._state.wait_idle(self._drain_timeout_s)
        if self._cutting_off:  # a second signal is already cutting off and will stop the server
            return
        if self.drained_cleanly:
            self.should_exit = True
            return
        log.warning("drain timeout: %d request(s) still in flight are cut off", self._state.in_flight)
        self._cutting_off = True
        await self._cut_off("drain_timeout")

    async def _cut_off(self, reason: str) -> None:
        self._state.cut_off(reason)  # their streams end with an error chunk, then [DONE]
        await self._state.wait_idle(_CUT_OFF_FLUSH_S)
        self.should_exit = True


    def on_engine_death(self, what: str) -> None:
        """Engine death listener (any thread): the streams already ended with engine_error; flush, then exit 1."""
        self.engine_died = True
        if self._loop is None:
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._exit_after_flush()))  # type: ignore[union-attr]

    async def _exit_after_flush(self) -> None:
        await asyncio.gather(self._state.wait_idle(_ENGINE_DEATH_GRACE_S), asyncio.sleep(_ENGINE_DEATH_GRACE_S))
        self.should_exit = True


def drain_started_message(signal_name: str, in_flight: int, drain_timeout_s: float) -> str:
    return f"{signal_name}: draining; {in_flight} request(s) in flight, up to {drain_timeout_s:g} s"


def serving_message(settings: ServerSettings, name: str) -> str:
    return f"flotilla-server: serving {name!r} on http://{settings.host}:{settings.port}; try:\n  {curl_example(settings, name)}"


def curl_example(settings: ServerSettings, model_name: str) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    return (
        f"curl -N http://{host}:{settings.port}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{model_name}\", \"stream\": true, \"max_tokens\": 32, "
        f"\"messages\": [{{\"role\": \"user\", \"content\": \"Tell me about the sea.\"}}]}}'"
    )


def configure_logging(settings: ServerSettings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def served_model(settings: ServerSettings, info: EngineInfo) -> ServedModel:
    return ServedModel(
        name=settings.served_model_name or info.name, tokenizer=info.tokenizer, vocab_size=info.vocab_size,
        max_model_len=info.max_model_len, description=info.description, is_demonstration=info.is_demonstration,
        weight_bytes=info.weight_bytes, quantization=info.quantization, adapters=info.adapters,
    )


def build_state(settings: ServerSettings, engine: EngineClient, model: ServedModel,
                share: FrontShare | None = None) -> ServerState:
    """One model's serving state: its engine, tokenizer and admission queue (a multi-model server's lanes too);
    with `share`, one of several HTTP processes' part of the queue (http/front_share.py)."""
    depth, batch_depth, tenant_max = settings.queue_capacity, settings.batch_queue_capacity, settings.tenant_max_queued
    shared: dict = {}
    if share is not None:
        depth, batch_depth, tenant_max = share.of(depth), share.of(batch_depth), share.of_cap(tenant_max)
        shared = {"front_slots": share.of(engine.stats().num_slots), "shared_queue_capacity": settings.queue_capacity}
    return ServerState(
        engine=engine, tokenizer=model.tokenizer, served_model_name=model.name, max_model_len=model.max_model_len,
        vocab_size=model.vocab_size, model_description=model.description,
        model_weight_bytes=model.weight_bytes, model_quantization=model.quantization, lora_dirs=settings.lora_dirs,
        structured=StructuredSettings.from_flags(settings.grammar_compile_timeout_s, settings.max_grammar_compiles,
                                                 settings.tool_call_parser),
        admission=AdmissionQueue(
            engine, depth=depth, queue_timeout_s=settings.queue_timeout_s, class_timeouts_s=settings.class_timeouts_s,
            batch_depth=batch_depth, tenant_max_queued=tenant_max,
        ),
        **shared,
    )


def serve(settings: ServerSettings, engine: EngineClient, model: ServedModel, share: FrontShare | None = None,
          sock: socket.socket | None = None) -> int:
    """Serve until drained (0) or the engine dies (1); shuts the (started) engine down on the way out.
    With `share` and `sock`: one of several HTTP processes (flotilla_server/fronts.py), on its own socket."""
    name = model.name
    state = build_state(settings, engine, model, share)
    app = create_app(state, settings.max_body_bytes, settings.api_key)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=1, access_log=False, http=door_protocol(state, settings.api_key),
                            loop=EVENT_LOOP)
    server = DrainingServer(config, state, settings.drain_timeout_s, signals_from_parent=share is not None)
    engine.add_death_listener(server.on_engine_death)
    if share is None:  # several HTTP processes: their parent says it once
        print(serving_message(settings, name), flush=True)  # a demonstration model is announced by the loader
    freeze_startup_heap()  # with --engine-mode inprocess this holds the model and the engine too
    try:
        server.run(sockets=None if sock is None else [sock])
    finally:
        engine.shutdown()
    if server.engine_died:
        log.error("the engine died: exiting 1 so that the server is restarted")
        return 1
    return 0
