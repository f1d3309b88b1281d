"""POST /v1/completions: a prompt (text or token ids, or a list of them) in, generated text out, streamed or whole."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from flotilla_server.http.errors import APIError
from flotilla_server.http.generation import generate
from flotilla_server.http.job import Job
from flotilla_server.http.params import (
    check_model,
    include_usage,
    logprobs_wanted,
    sampling_params,
)
from flotilla_server.http.schemas import CompletionRequest
from flotilla_server.http.state import ServerState, State
from flotilla_server.http.structured import constrain

router = APIRouter(tags=["completions"])


def prompts_of(state: ServerState, prompt: str | list[int] | list[str] | list[list[int]],
               echo: bool) -> tuple[list[list[int]], list[str] | None]:
    """The prompts' token ids and, for echo, their texts: one prompt, or each of a list (OpenAI's four forms)."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        items: list = [prompt]
    else:
        items = list(prompt)
    prompts: list[list[int]] = []
    for p, item in enumerate(items):
        where = f"prompt {p}" if len(items) > 1 else "prompt"
        if isinstance(item, str):
            prompts.append(state.tokenizer.encode(item))
            if not prompts[-1]:
                raise APIError(400, f"{where} is empty after tokenization: send at least one token.", param="prompt")
            continue
        bad = [t for t in item if t >= state.vocab_size]
        if bad:
            raise APIError(400, f"{where} holds token ids outside the vocabulary (< {state.vocab_size}): {bad[:5]}; "
                                "send ids the model's tokenizer produced.", param="prompt")
        prompts.append(list(item))
    if not echo:
        return prompts, None
    texts = [item if isinstance(item, str) else state.tokenizer.decode(item) for item in items]
    return prompts, texts


@router.post("/v1/completions", responses={400: {}, 404: {}, 413: {}, 429: {}, 503: {}})
async def create_completion(body: CompletionRequest, request: Request, state: State) -> Response:
    """Complete a prompt, or each of a list (OpenAI-compatible); with stream=true the answer is server-sent events."""
    lora = check_model(state, body.model)
    logprobs = logprobs_wanted("logprobs", body.logprobs)
    if body.echo and logprobs is not None:
        raise APIError(400, "echo with logprobs asks for the prompt's log-probabilities, which this server does not "
                            "compute: drop echo or logprobs.", param="echo", code="unsupported_field")
    prompts, echo_texts = prompts_of(state, body.prompt, body.echo)
    grammar = await constrain(state, body)
    params = sampling_params(state, body, max(map(len, prompts)), body.max_tokens, request, logprobs=logprobs,
                             grammar=grammar, lora=lora)
    job = Job(chat=False, request_id=f"cmpl-{uuid.uuid4().hex}", prompts=prompts, params=params,
              stream=body.stream, include_usage=include_usage(body), echo_texts=echo_texts)
    return await generate(request, state, job)
