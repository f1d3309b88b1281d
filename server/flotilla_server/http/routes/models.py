"""GET /v1/models: the one model this server serves."""

from __future__ import annotations

from fastapi import APIRouter

from flotilla_server.http.state import State

router = APIRouter(tags=["models"])


@router.get("/v1/models")
async def list_models(state: State) -> dict:
    """List the served model (OpenAI-compatible)."""
    card = {
        "id": state.served_model_name, "object": "model", "created": state.created_s, "owned_by": "flotilla",
        "max_model_len": state.max_model_len,
        "weight_bytes": state.model_weight_bytes, "quantization": state.model_quantization,
    }
    if state.model_description:
        card["description"] = state.model_description
    return {"object": "list", "data": [card]}
