"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: vLLM's runtime adapter API.

The bodies are vLLM's (`lora_name`, `lora_path`; vLLM's `load_inplace` and `lora_int_id` are accepted, the
first only as false); any other field is refused by name. The path rule runs on a thread
(http/lora_paths.py: a stat may block on a network volume), the adapter is read in the engine process on a
thread of its own (engine/adapter_service.py), and the call is answered once the engine has: the event
loop never waits on a disk. Success is vLLM's plain-text line; a refusal is the usual JSON error naming the
field. Guarded by --api-key like every /v1/ path (http/api_key.py); off (403) without --lora-dir.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from flotilla_contract.model_list import name_problem
from pydantic import BaseModel, ConfigDict

from flotilla_server.engine.messages import AdapterReply, LoadAdapter, UnloadAdapter
from flotilla_server.http import lora_paths
from flotilla_server.http.errors import APIError
from flotilla_server.http.state import ServerState, State

router = APIRouter(tags=["lora"])

_CODES = {403: "lora_updates_off", 404: "model_not_found", 409: "lora_adapter_conflict"}


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str
    load_inplace: bool = False  # vLLM's: replace a loaded adapter of that name; not served (unload it first)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's; an adapter is named by lora_name alone here


def _check_on(state: ServerState, param: str) -> None:
    if not state.lora_dirs:
        raise APIError(403, "Runtime LoRA adapter loads and unloads are off on this server: start it with "
                            "--lora-dir DIR, the directories lora_path may lie under.", param=param,
                       code=_CODES[403])


def _answer(reply: AdapterReply, default_param: str) -> PlainTextResponse:
    if reply.status == 200:
        return PlainTextResponse(reply.message)
    raise APIError(reply.status, reply.message, param=reply.param or default_param,
                   code=_CODES.get(reply.status, "invalid_lora_adapter"))


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse,
             responses={400: {}, 403: {}, 409: {}, 503: {}})
async def load_lora_adapter(body: LoadLoraAdapterRequest, state: State) -> PlainTextResponse:
    """Load a PEFT LoRA adapter from under --lora-dir; requests may then name it as `model`."""
    _check_on(state, "lora_path")
    problem = name_problem(body.lora_name)
    if problem is not None:
        raise APIError(400, f"lora_name: {problem}.", param="lora_name")
    if body.lora_name == state.served_model_name:
        raise APIError(400, f"lora_name {body.lora_name!r} is the served model's name: a request naming it would "
                            "be ambiguous; choose another name.", param="lora_name")
    if body.load_inplace:
        raise APIError(400, "load_inplace is not served: unload the adapter (POST /v1/unload_lora_adapter), then "
                            "load it again.", param="load_inplace")
    real, problem = await asyncio.to_thread(lora_paths.resolve, body.lora_path, state.lora_dirs)
    if problem is not None:
        raise APIError(400, problem, param="lora_path", code="lora_path_not_allowed")
    reply = await state.engine.adapter_call(LoadAdapter(uuid.uuid4().hex, body.lora_name, real))
    return _answer(reply, "lora_path")


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse,
             responses={403: {}, 404: {}, 409: {}, 503: {}})
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, state: State) -> PlainTextResponse:
    """Stop serving an adapter: requests already admitted finish with it, later ones naming it get a 404."""
    _check_on(state, "lora_name")
    reply = await state.engine.adapter_call(UnloadAdapter(uuid.uuid4().hex, body.lora_name))
    return _answer(reply, "lora_name")
