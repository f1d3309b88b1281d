"""A multi-model server's own endpoints: the model list with each model's state, the load report, metrics
and probes. Generation requests never reach these routes: the front hands them to a model's lane."""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from flotilla_contract.load import LOAD_PATH, MODEL_LOAD_PATH, ServerLoad
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from flotilla_server.http.errors import error_body, install_error_handlers
from flotilla_server.http.load_report import pool_load
from flotilla_server.http.pool_front import FrontRefusal, PoolFront

log = logging.getLogger(__name__)


def create_pool_app(front: PoolFront) -> FastAPI:
    app = FastAPI(title="flotilla-server (multi-model)",
                  summary="OpenAI-compatible LLM inference over several models in one memory budget.",
                  version="0.1.0")
    install_error_handlers(app)
    created_s = int(time.time())

    @app.get("/v1/models")
    async def list_models() -> dict:
        """Every model this server can serve, with its state: loaded, loading or available (loads on first use);
        then each LoRA adapter once, with its base model as `parent` (as vLLM lists them) and the base's state."""
        cards = []
        states = {}
        for status in front.cache.status():
            states[status.name] = status.state
            card = {"id": status.name, "object": "model", "created": created_s, "owned_by": "flotilla",
                    "state": status.state, "memory_bytes": status.memory_bytes or status.footprint_bytes}
            lane = front.lanes.get(status.name)
            if lane is not None:
                card["max_model_len"] = lane.state.max_model_len
                card["weight_bytes"] = lane.state.model_weight_bytes
                card["quantization"] = lane.state.model_quantization
                if lane.state.model_description:
                    card["description"] = lane.state.model_description
            cards.append(card)
        for adapter, base in front.cache.adapters():
            cards.append({"id": adapter, "object": "model", "created": created_s, "owned_by": "flotilla",
                          "parent": base, "root": adapter, "state": states.get(base, "available")})
        return {"object": "list", "data": cards}

    @app.get(LOAD_PATH, response_model=ServerLoad)
    async def load() -> Response:
        """Per model: state, queue, memory and idle time; the memory budget and what is free; the list file's refusals."""
        rows, max_loras = [], {}
        for status in front.cache.status():
            lane = front.lanes.get(status.name)
            stats = lane.state.engine.stats() if lane is not None else None
            rows.append((status, stats, len(lane.state.admission) if lane is not None else 0))
            if lane is not None:
                max_loras[status.name] = lane.state.max_loras
        report = pool_load(accepting=front.accepting, models=rows, queue_capacity=front.settings.queue_capacity,
                           budget_bytes=front.cache.budget_bytes, used_bytes=front.cache.used_bytes(),
                           model_list=front.cache.list_status(), adapters=front.cache.adapters(), max_loras=max_loras)
        return Response(report.model_dump_json(), media_type="application/json")

    preloads: set[asyncio.Task] = set()  # held, so a load in flight is not collected

    async def preload_in_background(name: str) -> None:
        try:
            await front.preload(name)
        except FrontRefusal as refusal:
            log.warning("model %s was asked to load and did not: %s", name, refusal.message)

    @app.post(MODEL_LOAD_PATH, status_code=202, responses={200: {}, 400: {}, 404: {}, 503: {}})
    async def load_model(name: str) -> JSONResponse:
        """Load a listed model now, as its first request would: 202 while it loads (GET LOAD_PATH shows its
        state), 200 when it is loaded already; 404 for a model not listed here, 400 for one the memory budget
        can never hold, 503 while the server drains."""
        cache = front.cache
        if not front.accepting:
            return JSONResponse(error_body(503, "The server is draining and loads no model.", None, "draining"), 503)
        if name not in cache.names():
            return JSONResponse(error_body(404, f"The model {name!r} is not listed here: this server serves "
                                           f"{', '.join(sorted(cache.names()))}.", "name", "model_not_found"), 404)
        footprint = cache.footprint_bytes(name) or 0
        if footprint > cache.budget_bytes:
            return JSONResponse(error_body(400, f"The model {name!r} needs {footprint} bytes, more than this server's "
                                           f"whole memory budget ({cache.budget_bytes} bytes).", "name",
                                           "model_too_large"), 400)
        if cache.is_loaded(name):
            return JSONResponse({"model": name, "state": "loaded"}, 200)
        task = asyncio.create_task(preload_in_background(name))
        preloads.add(task)
        task.add_done_callback(preloads.discard)
        return JSONResponse({"model": name, "state": "loading"}, 202)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/health")
    async def health() -> Response:
        """vLLM's health check: 200 with no body while the process answers (each model's engine is its own)."""
        return Response(status_code=200)

    @app.get("/readyz", responses={503: {}})
    async def readyz() -> JSONResponse:
        """Ready once started and until draining: models load on demand, so none need be loaded."""
        if front.accepting:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "draining" if front.draining else "loading"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Every model's series and the model cache's, each labelled with its model."""
        return Response(generate_latest(front.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
