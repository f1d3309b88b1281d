"""Server-sent events framing and the OpenAI chunk shapes, as pure functions.

The stream contract: one ``data:`` event per chunk, sent as soon as it exists; each chunk holds one
choice, named by its ``index``, and each choice's last chunk carries ``finish_reason``. With ``stream_options.include_usage``, as OpenAI does it, every chunk carries
``"usage": null`` and one more chunk with empty ``choices`` carries the usage; without it no chunk has a
``usage`` key. Then ``data: [DONE]``. A failure after the stream started is an error
chunk, then ``[DONE]``: without a final event a clean end cannot be told from a dropped connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy may buffer the stream


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def usage(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens}


def _chunk(request_id: str, created: int, model: str, obj: str, choice: dict[str, Any],
           include_usage: bool) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": request_id, "object": obj, "created": created, "model": model,
                             "choices": [choice]}
    if include_usage:
        chunk["usage"] = None  # OpenAI's shape: null on every chunk but the usage chunk
    return chunk


def completion_choice(index: int, text: str, finish_reason: str | None, logprobs: Any = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_logprobs(content: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return None if content is None else {"content": content, "refusal": None}


def completion_chunk(request_id: str, created: int, model: str, text: str, finish_reason: str | None = None,
                     include_usage: bool = False, index: int = 0, logprobs: Any = None) -> dict[str, Any]:
    return _chunk(request_id, created, model, "text_completion",
                  completion_choice(index, text, finish_reason, logprobs), include_usage)


def chat_chunk(request_id: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               include_usage: bool = False, index: int = 0,
               logprobs_content: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return _chunk(request_id, created, model, "chat.completion.chunk",
                  {"index": index, "delta": delta, "logprobs": chat_logprobs(logprobs_content),
                   "finish_reason": finish_reason}, include_usage)


def usage_chunk(request_id: str, created: int, model: str, chat: bool, usage_: dict[str, int]) -> dict[str, Any]:
    """The last chunk of a stream that asked for include_usage: no choices, only the usage."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_}


def chat_choice(index: int, text: str | None, finish_reason: str,
                logprobs_content: list[dict[str, Any]] | None = None,
                tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`text` is None in a reply that is only tool calls, as OpenAI's content is then."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": chat_logprobs(logprobs_content),
            "finish_reason": finish_reason}


def response(request_id: str, created: int, model: str, chat: bool, choices: list[dict[str, Any]],
             usage_: dict[str, int]) -> dict[str, Any]:
    """A whole answer: `choices` from `chat_choice` or `completion_choice`, in index order."""
    obj = "chat.completion" if chat else "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": choices,
            "usage": usage_}


def error_chunk(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


_MARK = "\x00flotilla-text\x00"


class DeltaEncoder:
    """Encodes one request's mid-stream chunks fast: the text is spliced into a chunk pre-rendered once.

    Byte-for-byte what ``sse_event(make_chunk(text))`` gives, without building and serializing a dict per
    token (that cost is paid on the event loop, under the GIL the engine thread also needs).
    """

    def __init__(self, make_chunk: Callable[[str], dict[str, Any]]) -> None:
        rendered = sse_event(make_chunk(_MARK))
        mark = json.dumps(_MARK, ensure_ascii=False).encode()
        self._head, self._tail = rendered.split(mark)

    def __call__(self, text: str) -> bytes:
        return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail
