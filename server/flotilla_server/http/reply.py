"""One answer's choices in OpenAI's shapes: what the engine's events become before they are sent.

- **Framing and chunks.** The stream contract: one ``data:`` event per chunk, sent as soon as it exists; each
  chunk holds one choice, named by its ``index``, and each choice's last chunk carries ``finish_reason``. With
  ``stream_options.include_usage``, as OpenAI does it, every chunk carries ``"usage": null`` and one more chunk
  with empty ``choices`` carries the usage; without it no chunk has a ``usage`` key. Then ``data: [DONE]``. A
  failure after the stream started is an error chunk, then ``[DONE]``: without a final event a clean end cannot
  be told from a dropped connection.
- **Log-probabilities**, in OpenAI's two shapes, from the engine's per-token `TokenLogprobs`:
  - chat: `choices[].logprobs.content[]` of `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`,
    with exactly `top_logprobs` alternatives;
  - completions (legacy): `choices[].logprobs` of parallel lists `tokens`, `token_logprobs`, `top_logprobs` (a
    dict of token text to logprob: the `logprobs` likeliest and the sampled token, so up to logprobs + 1
    entries, as OpenAI documents) and `text_offset` (each token's character offset in the choice's text).
  A token's text is the token decoded alone, special tokens included, as vLLM shows it; a token holding only
  part of a character decodes to U+FFFD, and `bytes` are the UTF-8 bytes of that text (vLLM's rule). A logprob
  of -inf (a probability that underflowed) is sent as -9999.0, as vLLM does: JSON has no -inf.
- **The choices** of one answer as the events arrive: each choice's text, finish, logprobs and (chat with tools)
  tool calls (http/tool_calls.py). Events of several choices (`n`, a list of prompts) interleave, each naming
  its `index`. With echo, a choice's text starts with its prompt's text; a completions choice's `text_offset`
  counts from the start of its text.

render_sse.py streams these, render_json.py returns them whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flotilla_server.engine.outputs import TokenLogprobs
from flotilla_server.engine.stream import TokenEvent
from flotilla_server.http.job import Job
from flotilla_server.http.tool_calls import collect

# --- framing and chunks -----------------------------------------------------------------------------------

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


# --- log-probabilities --------------------------------------------------------------------------------

LOWEST_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return max(logprob, LOWEST_LOGPROB)


class TokenTexts:
    """Token id -> its text, decoded once per id."""

    def __init__(self, decode: Callable[..., str]) -> None:
        self._decode = decode
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._decode([token_id], skip_special_tokens=False)
        return text


def chat_content(token_ids: Sequence[int], entries: Sequence[TokenLogprobs], text: TokenTexts) -> list[dict[str, Any]]:
    """`logprobs.content` entries of chat, one per token."""

    def one(token_id: int, logprob: float) -> dict[str, Any]:
        t = text(token_id)
        return {"token": t, "logprob": _finite(logprob), "bytes": list(t.encode("utf-8"))}

    return [{**one(token_id, e.logprob), "top_logprobs": [one(i, v) for i, v in e.top]}
            for token_id, e in zip(token_ids, entries, strict=True)]


class CompletionLogprobs:
    """The legacy completions shape of one choice, built chunk by chunk: `text_offset` runs on across chunks."""

    def __init__(self, text: TokenTexts, start_offset: int = 0) -> None:
        self._text = text
        self._offset = start_offset  # characters of the choice's text before its next token (an echoed prompt)

    def add(self, token_ids: Sequence[int], entries: Sequence[TokenLogprobs]) -> dict[str, list[Any]]:
        """The shape for these tokens (a streamed chunk's, or the whole choice's when given all of them)."""
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, e in zip(token_ids, entries, strict=True):
            t = self._text(token_id)
            top = {self._text(i): _finite(v) for i, v in e.top}
            top.setdefault(t, _finite(e.logprob))
            out["tokens"].append(t)
            out["token_logprobs"].append(_finite(e.logprob))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self._offset)
            self._offset += len(t)
        return out


# --- the choices -----------------------------------------------------------------------------------------

@dataclass
class Choice:
    parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0


class Choices:
    def __init__(self, job: Job, decode: Any) -> None:
        self.job = job
        self.texts = TokenTexts(decode) if job.params.logprobs is not None else None
        self._streamed: dict[int, CompletionLogprobs] = {}  # completions streaming: each choice's text offset
        self.all = [Choice(parts=[job.echo(i)]) for i in range(job.num_choices)]
        self.num_finished = 0

    @property
    def done(self) -> bool:
        return self.num_finished == len(self.all)

    def on_event(self, event: TokenEvent) -> None:
        """Count an event of one choice (not an abort)."""
        c = self.all[event.index]
        c.num_output_tokens = max(c.num_output_tokens, event.num_output_tokens)
        if event.finish_reason is not None:
            c.finish_reason = event.finish_reason
            self.num_finished += 1

    def collect(self, event: TokenEvent) -> None:
        """Keep an event's text and logprobs for a whole (non-streamed) answer."""
        self.on_event(event)
        c = self.all[event.index]
        c.parts.append(event.text)
        if event.logprobs:
            c.token_ids += event.token_ids
            c.logprobs += event.logprobs

    def usage(self) -> dict[str, int]:
        return usage(self.job.num_prompt_tokens, sum(c.num_output_tokens for c in self.all))

    def chunk_logprobs(self, event: TokenEvent) -> Any:
        """A streamed chunk's logprobs: chat `content` entries, or the completions shape; None if not asked."""
        if self.texts is None or not event.logprobs:
            return None
        if self.job.chat:
            return chat_content(event.token_ids, event.logprobs, self.texts)
        shaper = self._streamed.get(event.index)
        if shaper is None:
            shaper = self._streamed[event.index] = CompletionLogprobs(self.texts, len(self.job.echo(event.index)))
        return shaper.add(event.token_ids, event.logprobs)

    def rendered(self) -> list[dict[str, Any]]:
        """Every choice of a whole answer, in index order."""
        out = []
        for i, c in enumerate(self.all):
            text, reason = "".join(c.parts), c.finish_reason or "abort"
            if self.job.chat:
                content = chat_content(c.token_ids, c.logprobs, self.texts) if self.texts is not None else None
                reader = self.job.tool_reader()
                if reader is None:
                    out.append(chat_choice(i, text, reason, content))
                    continue
                reader.feed(text)  # the streaming reader over the whole text: a stream reassembles to this
                reader.finish()
                parsed = collect(reader.deltas)
                out.append(chat_choice(i, parsed.content, reader.finish_reason(reason), content,
                                           parsed.tool_calls))
            else:
                lp = None
                if self.texts is not None:
                    lp = CompletionLogprobs(self.texts, len(self.job.echo(i))).add(c.token_ids, c.logprobs)
                out.append(completion_choice(i, text, reason, lp))
        return out
