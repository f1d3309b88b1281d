"""From a validated request body to the engine's SamplingParams; checks that need the server's state."""

from __future__ import annotations

import re

from fastapi import Request
from flotilla_contract.classes import CLASS_FIELD, DEFAULT_REQUEST_CLASS, NO_TENANT, REQUEST_CLASSES
from flotilla_contract.labels import CLASS_HEADER, TENANT_HEADER
from flotilla_contract.load import PREFIX_KEY_HEADER, PREFIX_KEY_MAX_CHARS

from flotilla_server.engine.sampling_params import DEFAULT_MAX_TOKENS, MAX_LOGPROBS, SamplingParams
from flotilla_server.http.errors import APIError
from flotilla_server.http.schemas import _SamplingFields
from flotilla_server.http.state import ServerState


def include_usage(body: _SamplingFields) -> bool:
    return body.stream and body.stream_options is not None and body.stream_options.include_usage


_PREFIX_KEY = re.compile(rf"[0-9A-Za-z_.:-]{{1,{PREFIX_KEY_MAX_CHARS}}}")


def prefix_key(request: Request) -> str | None:
    """The gateway's name for the prompt's prefix, when sent (engine/prefix_keys.py)."""
    sent = request.headers.get(PREFIX_KEY_HEADER)
    if sent is None:
        return None
    if not _PREFIX_KEY.fullmatch(sent):
        raise APIError(400, f"The {PREFIX_KEY_HEADER} header must be 1 to {PREFIX_KEY_MAX_CHARS} letters, digits "
                            "or any of _.:- (a gateway sets it): fix or drop the header.", param=PREFIX_KEY_HEADER)
    return sent


MAX_TENANT_CHARS = 256


def request_class(request: Request, body: _SamplingFields) -> str:
    """The header, else the body field, else interactive."""
    sent = request.headers.get(CLASS_HEADER)
    if sent is None:
        return body.flotilla_class or DEFAULT_REQUEST_CLASS
    if sent.strip().lower() not in REQUEST_CLASSES:
        raise APIError(400, f"The {CLASS_HEADER} header is {sent!r}: send one of {', '.join(REQUEST_CLASSES)} "
                            f"(or the {CLASS_FIELD} field), or drop it for {DEFAULT_REQUEST_CLASS}.",
                       param=CLASS_HEADER)
    return sent.strip().lower()


def tenant(request: Request, body: _SamplingFields) -> str:
    """The header (a gateway sets it from the API key), else the OpenAI `user` field, else none."""
    sent = request.headers.get(TENANT_HEADER)
    name, param = (sent, TENANT_HEADER) if sent is not None else (body.user or NO_TENANT, "user")
    if len(name) > MAX_TENANT_CHARS:
        raise APIError(400, f"The tenant ({param}) is {len(name)} characters long: send at most {MAX_TENANT_CHARS}.",
                       param=param)
    return name


def check_model(state: ServerState, model: str) -> str | None:
    """The LoRA adapter a request's `model` names (None: the base model); a 404 for any other name."""
    if model == state.served_model_name:
        return None
    if model in state.adapters:
        state.metrics.count_adapter_request(model)
        return model
    adapters = f" and the LoRA adapters {', '.join(map(repr, state.adapters))}" if state.adapters else ""
    raise APIError(404, f"The model {model!r} does not exist here: this server serves "
                        f"{state.served_model_name!r}{adapters} (see GET /v1/models).",
                   param="model", code="model_not_found")


def logprobs_wanted(field: str, count: int | None) -> int | None:
    """How many likeliest tokens to return beside each sampled token's logprob; a 400 above the bound."""
    if count is not None and count > MAX_LOGPROBS:
        raise APIError(400, f"{field} is {count}, but this server returns at most {MAX_LOGPROBS} log-probabilities "
                            f"per token: set {field} to {MAX_LOGPROBS} or less.", param=field)
    return count


def sampling_params(state: ServerState, body: _SamplingFields, num_prompt_tokens: int,
                    max_tokens: int | None, request: Request, chat: bool = False,
                    logprobs: int | None = None, grammar: str | None = None, lora: str | None = None) -> SamplingParams:
    """`num_prompt_tokens`: of the longest prompt; `logprobs`: from `logprobs_wanted`; `request` gives the
    prefix key, the class and the tenant; `lora`: from `check_model`."""
    num_slots = state.engine.stats().num_slots
    if body.n > num_slots:  # the n choices of a prompt run at once
        raise APIError(400, f"n is {body.n}, but this server runs at most {num_slots} sequences at once and the "
                            f"choices of one prompt run together: set n to {num_slots} or less.", param="n")
    if num_prompt_tokens == 0:
        raise APIError(400, "The prompt is empty after tokenization: send at least one token.", param="prompt")
    if max_tokens is None and num_prompt_tokens >= state.max_model_len:  # never ask to lower a field not sent
        raise APIError(400, f"The prompt ({num_prompt_tokens} tokens) fills the model's context of "
                            f"{state.max_model_len} tokens, leaving no room for an answer: shorten the prompt.",
                       param="prompt", code="context_length_exceeded")
    if max_tokens is None:
        left = state.max_model_len - num_prompt_tokens
        # chat: OpenAI sets no default, so the reply may take the whole context left; completions: 16,
        # OpenAI's default, shortened to what the context has left
        max_tokens = max(1, left if chat else min(DEFAULT_MAX_TOKENS, left))
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=max(0, body.top_k),
            seed=body.seed,
            stop=body.stop_strings(),
            ignore_eos=body.ignore_eos,
            cache_salt=body.cache_salt,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            repetition_penalty=body.repetition_penalty if body.repetition_penalty is not None else 1.0,
            min_p=body.min_p or 0.0,
            n=body.n,
            logprobs=logprobs,
            prefix_key=prefix_key(request),
            request_class=request_class(request, body),
            tenant=tenant(request, body),
            priority=body.priority,
            grammar=grammar,
            lora=lora,
            speculative=body.speculative,
        )
    except ValueError as e:
        raise APIError(400, f"{e}: change that field and retry.") from None
