"""A multi-model server's own endpoints: the model list with each model's state, the load report, metrics
and probes. Generation requests never reach these routes: the front hands them to a model's lane."""

from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from flotilla_contract.load import LOAD_PATH, ServerLoad
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from flotilla_server.http.errors import install_error_handlers
from flotilla_server.http.load_report import pool_load
from flotilla_server.http.pool_front import PoolFront


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

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

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
