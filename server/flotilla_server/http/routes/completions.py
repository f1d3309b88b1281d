"""POST /v1/completions: a text prompt (or token ids) in, generated text out, streamed or whole."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from flotilla_server.http.errors import APIError
from flotilla_server.http.generation import generate
from flotilla_server.http.job import Job
from flotilla_server.http.params import check_model, include_usage, sampling_params
from flotilla_server.http.schemas import CompletionRequest
from flotilla_server.http.state import State

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", responses={400: {}, 404: {}, 413: {}, 429: {}, 503: {}})
async def create_completion(body: CompletionRequest, request: Request, state: State) -> Response:
    """Complete a prompt (OpenAI-compatible); with stream=true the answer is server-sent events."""
    check_model(state, body.model)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt_ids = state.tokenizer.encode(prompt)
    else:
        vocab = state.vocab_size
        bad = [t for t in prompt if t >= vocab]
        if bad:
            raise APIError(400, f"prompt holds token ids outside the vocabulary (< {vocab}): {bad[:5]}; "
                                "send ids the model's tokenizer produced.", param="prompt")
        prompt_ids = list(prompt)
    params = sampling_params(state, body, len(prompt_ids), body.max_tokens)
    job = Job(chat=False, request_id=f"cmpl-{uuid.uuid4().hex}", prompt_token_ids=prompt_ids,
              params=params, stream=body.stream, include_usage=include_usage(body))
    return await generate(request, state, job)
