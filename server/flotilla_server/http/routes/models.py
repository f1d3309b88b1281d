"""GET /v1/models: the one model this server serves, and the LoRA adapters served on it (each with the model
as its `parent`, as vLLM lists them)."""

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
    adapters = [{"id": name, "object": "model", "created": state.created_s, "owned_by": "flotilla",
                 "parent": state.served_model_name, "root": name, "max_model_len": state.max_model_len}
                for name in state.adapters]
    return {"object": "list", "data": [card, *adapters]}
