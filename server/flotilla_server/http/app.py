"""The FastAPI application: routers, error handlers, the body guard, and the hooks into the engine client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from flotilla_server.http.api_key import ApiKeyGuard
from flotilla_server.http.body_guard import BodyGuard
from flotilla_server.http.errors import install_error_handlers
from flotilla_server.http.routes import include_routers
from flotilla_server.http.shedder import LoadShedder
from flotilla_server.http.state import ServerState


def start_serving(state: ServerState) -> None:
    """On the event loop: hook the engine's listeners (the engine owns the admission queue); then ready."""
    state.engine.add_step_listener(state.metrics.observe_step)
    state.engine.add_abort_listener(state.on_abort)
    state.ready = True


async def stop_serving(state: ServerState) -> None:
    state.ready = False
    await state.grammars.close()  # the compile probes' processes


def create_app(state: ServerState, max_body_bytes: int, api_key: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        start_serving(state)
        try:
            yield
        finally:
            await stop_serving(state)

    app = FastAPI(
        title="flotilla-server",
        summary="OpenAI-compatible LLM inference with bounded admission and SSE streaming.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI needs a CDN: /docs is routes/docs_page.py instead, self-contained
        redoc_url=None,
    )
    app.state.flotilla = state
    install_error_handlers(app)
    include_routers(app)
    app.add_middleware(BodyGuard, max_body_bytes=max_body_bytes, on_refuse=state.metrics.count_request)
    app.add_middleware(LoadShedder, state=state)
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key)  # added last: runs first, so no key learns the load
    return app
