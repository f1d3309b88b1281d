"""POST /v1/chat/completions: messages in, rendered through the model's chat template, a reply out."""

from __future__ import annotations

import logging
import re
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
from flotilla_server.http.schemas import ChatCompletionRequest
from flotilla_server.http.state import State
from flotilla_server.http.structured import constrain
from flotilla_server.http.tools import plan_tools, template_messages
from flotilla_server.model.tokenizer import ChatTemplateError

router = APIRouter(tags=["chat"])
log = logging.getLogger("flotilla.server")


def template_reads_name(template: str | None) -> bool:
    """Whether a chat template reads `message.name` / `message['name']` (so a message's name reaches the model)."""
    return template is not None and re.search(r"""message(\.name\b|\[\s*['"]name['"]\s*\])""", template) is not None


@router.post("/v1/chat/completions", responses={400: {}, 404: {}, 413: {}, 429: {}, 503: {}})
async def create_chat_completion(body: ChatCompletionRequest, request: Request, state: State) -> Response:
    """Answer a conversation (OpenAI-compatible); with stream=true the answer is server-sent events."""
    lora = check_model(state, body.model)
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: set logprobs to true, or drop top_logprobs.",
                       param="top_logprobs")
    logprobs = logprobs_wanted("top_logprobs", body.top_logprobs or 0) if body.logprobs else None
    named = [i for i, m in enumerate(body.messages) if m.name is not None]
    template = state.tokenizer.chat_template
    if named and not template_reads_name(template):
        raise APIError(400, "messages[].name is not supported by this model: its chat template does not use "
                            "a message's name; remove name (or put it in the content) and retry.",
                       param=f"messages.{named[0]}.name", code="unsupported_field")
    tools = plan_tools(body, template, state.structured.tool_call_parser)
    if tools is not None and tools.parse:
        refuse_beside_tools(body)
    messages, variables = template_messages(body, tools, template)
    try:
        text = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **variables)
    except ChatTemplateError as e:  # no template, or it refuses an order of roles
        raise APIError(400, f"{e}: check the messages' roles and order.", param="messages") from None
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    log.debug("request %s: the rendered prompt: %r", request_id, text)
    prompt_ids = state.tokenizer.encode(text, add_special_tokens=False)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    grammar = await constrain(state, body, tools.constraint if tools is not None else None)
    params = sampling_params(state, body, len(prompt_ids), max_tokens, request, chat=True, logprobs=logprobs,
                             grammar=grammar, lora=lora)
    job = Job(chat=True, request_id=request_id, prompts=[prompt_ids], params=params, stream=body.stream,
              include_usage=include_usage(body), tool_parser=tools.parser if tools is not None and tools.parse else None,
              max_tool_calls=tools.max_calls if tools is not None else None)
    return await generate(request, state, job)


def refuse_beside_tools(body: ChatCompletionRequest) -> None:
    """What cannot be honoured in a reply read for tool calls."""
    if body.logprobs:
        raise APIError(400, "logprobs cannot be combined with tools here: the reply's tokens hold the calls' text; "
                            "drop logprobs, or send tool_choice none.", param="logprobs", code="unsupported_field")
    if body.response_format is not None and body.response_format.type != "text":
        raise APIError(400, "response_format cannot be combined with tools: a reply is either a tool call or the "
                            "JSON the format asks for; drop one, or send tool_choice none.", param="response_format")
