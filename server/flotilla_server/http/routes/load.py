"""GET /flotilla/v1/load: the light load report (flotilla_contract.load.ServerLoad) the gateway polls."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from flotilla_contract.load import LOAD_PATH, ServerLoad

from flotilla_server.http.load_report import server_load
from flotilla_server.http.state import State

router = APIRouter(tags=["health"])


@router.get(LOAD_PATH, response_model=ServerLoad)
async def load(state: State) -> Response:
    """Queue, slots, KV usage and readiness in one small JSON body; ready is false while loading or draining."""
    report = server_load(stats=state.engine.stats(), queued=sum(state.queued_by_class().values()),
                         queue_capacity=state.queue_capacity, accepting=state.accepting,
                         model_name=state.served_model_name, max_loras=state.max_loras)
    # serialized here, once: FastAPI would validate the model a second time through response_model
    return Response(report.model_dump_json(), media_type="application/json")
