"""Probes and metrics: /healthz (the process answers), /readyz (model loaded, not draining), /metrics, and
/health, vLLM's own check, for the Gateway API Inference Extension's model-server protocol."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from flotilla_server.http.state import State

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict:
    """Liveness: answers while the event loop runs."""
    return {"status": "ok"}


@router.get("/health", responses={503: {}})
async def health(state: State) -> Response:
    """vLLM's health check: 200 with no body while the engine lives (loading and draining too), 503 once it died."""
    return Response(status_code=503 if state.ready and not state.engine.alive else 200)


@router.get("/readyz", responses={503: {}})
async def readyz(state: State) -> JSONResponse:
    """Readiness: 200 once the model is loaded, 503 while loading or draining, or once the engine died."""
    if state.accepting:
        return JSONResponse({"status": "ready"})
    status = "draining" if state.draining else "engine_dead" if state.ready and not state.engine.alive else "loading"
    return JSONResponse({"status": status}, status_code=503)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    """Prometheus metrics, every series labelled with the model."""
    return Response(generate_latest(state.metrics.exposition), media_type=CONTENT_TYPE_LATEST)
