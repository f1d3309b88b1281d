"""The tokens an answer used, read from its bytes as they pass through (nothing is held back), so that a
reservation can be reconciled when the answer ends.

Rules (docs/gateway.md, "Rate limits"):
- an answer whose status is not 2xx used no tokens;
- the server's `usage` counts when the answer carries it: the body's `usage` (not streamed), or the last SSE
  chunk's (streamed with stream_options.include_usage), as total_tokens, else prompt_tokens + completion_tokens;
- without it, a stream counts the prompt estimate plus one token per SSE event that is not [DONE] (the server
  sends one event per decoded token and choice), and a body the prompt estimate plus its choices' text
  divided by CHARS_PER_TOKEN, rounded up (a body over MAX_BODY_BYTES: all its bytes, so divided).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from flotilla_gateway.rate_limit_cost import CHARS_PER_TOKEN

MAX_BODY_BYTES = 8 * 1024 * 1024  # a plain answer is parsed whole up to this size
MAX_LINE_BYTES = 1024 * 1024  # an SSE line longer than this is counted, not parsed
_DATA = b"data:"
_DONE = b"[DONE]"
_USAGE = b'"usage"'
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')  # a chunk with usage; include_usage sends "usage": null on the rest


def usage_tokens(usage: Any) -> int | None:
    """The tokens an OpenAI `usage` object counts; None when it is absent or malformed."""
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int) and total >= 0:
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    if all(isinstance(p, int) and p >= 0 for p in parts):
        return sum(parts)
    return None


def _choices_chars(body: Any) -> int:
    choices = body.get("choices") if isinstance(body, dict) else None
    chars = 0
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict):
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else choice.get("text")
            chars += len(text) if isinstance(text, str) else 0
    return chars


class UsageMeter:
    """Watches one answer: `start` with its status and content type, `feed` each body chunk, then
    `used_tokens`."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens  # the estimate, for answers without usage
        self.status = 0  # 0: no answer started
        self.streamed = False
        self.events = 0  # SSE events other than [DONE], without usage
        self.usage: int | None = None  # from the last usage object seen
        self._body = bytearray()  # a plain answer, up to MAX_BODY_BYTES
        self._body_bytes = 0
        self._partial = b""  # an SSE line not yet ended

    def start(self, status: int, content_type: str) -> None:
        self.status = status
        self.streamed = content_type.split(";", 1)[0].strip().lower() == "text/event-stream"

    def feed(self, chunk: bytes) -> None:
        if not chunk or not 200 <= self.status < 300:
            return
        if not self.streamed:
            self._body_bytes += len(chunk)
            if self._body_bytes <= MAX_BODY_BYTES:
                self._body += chunk
            return
        if not self._partial and chunk.endswith(b"\n") and _USAGE not in chunk and _DONE not in chunk:
            # whole lines without usage or [DONE] (most chunks): each data line is one event, as _line counts it
            self.events += chunk.count(b"\n" + _DATA) + chunk.startswith(_DATA)
            return
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:  # one huge event: count it, parse none of it
            self.events += self._partial.startswith(_DATA)
            self._partial = b""
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.startswith(_DATA):
            return
        data = line[len(_DATA):].strip()
        if data == _DONE:
            return
        if _USAGE_OBJECT.search(data):  # parse only chunks that carry usage: the rest cost one search each
            try:
                found = usage_tokens(json.loads(data).get("usage"))
            except (ValueError, AttributeError):
                found = None
            if found is not None:
                self.usage = found
                return
        self.events += 1

    def used_tokens(self) -> int:
        if not 200 <= self.status < 300:
            return 0
        if self.streamed:
            if self._partial:
                self._line(self._partial)
                self._partial = b""
            return self.usage if self.usage is not None else self.prompt_tokens + self.events
        if self._body_bytes > MAX_BODY_BYTES:
            return self.prompt_tokens + math.ceil(self._body_bytes / CHARS_PER_TOKEN)
        try:
            body = json.loads(bytes(self._body))
        except ValueError:
            return self.prompt_tokens + math.ceil(self._body_bytes / CHARS_PER_TOKEN)
        found = usage_tokens(body.get("usage")) if isinstance(body, dict) else None
        if found is not None:
            return found
        return self.prompt_tokens + math.ceil(_choices_chars(body) / CHARS_PER_TOKEN)
