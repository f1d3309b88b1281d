"""What a request reserves against its key's tokens per minute, read from its body before it is sent.

The gateway has no tokenizer, so the prompt is estimated, and the answer's size is its most output; both are
reconciled with the server's `usage` when the answer ends (rate_limit_usage.py). Rules (docs/gateway.md,
"Rate limits"):
- prompt: the characters of its text divided by CHARS_PER_TOKEN, rounded up (chat: every message's text
  content, string or text parts; completions: the prompt, or each prompt of a list); a prompt sent as token
  ids counts its ids exactly;
- output: `max_completion_tokens` or `max_tokens`, times `n`, times the number of prompts;
- with neither stated, completions reserve 16 per choice (the server's default, and OpenAI's), and chat
  reserves DEFAULT_CHAT_OUTPUT_TOKENS per choice (the server lets such an answer take the whole context left,
  which the gateway does not know), lowered to what the key's burst leaves after the prompt (at least 1), so a
  request that never named a size is not refused for one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4  # English text runs at about 4 characters a token in Llama-family tokenizers
DEFAULT_COMPLETION_OUTPUT_TOKENS = 16  # flotilla-server's default max_tokens for /v1/completions, as OpenAI's
DEFAULT_CHAT_OUTPUT_TOKENS = 1024


@dataclass(frozen=True)
class RequestCost:
    prompt_tokens: int  # estimated, reconciled with usage.prompt_tokens at the end
    output_tokens: int  # reserved: the most the answer may take
    output_stated: bool  # the client set max_tokens (or max_completion_tokens)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _text_chars(content: Any) -> int:
    """Characters of a message's content: a string, or a list of parts whose text parts count."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part["text"]) for part in content
                   if isinstance(part, dict) and isinstance(part.get("text"), str))
    return 0


def prompt_estimate(body: dict[str, Any]) -> tuple[int, int]:
    """(estimated prompt tokens, number of prompts) of a chat or completions body."""
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = sum(_text_chars(m.get("content")) for m in messages if isinstance(m, dict))
        return math.ceil(chars / CHARS_PER_TOKEN), 1
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return math.ceil(len(prompt) / CHARS_PER_TOKEN), 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) for p in prompt):  # one prompt of token ids
            return len(prompt), 1
        chars = sum(len(p) for p in prompt if isinstance(p, str))
        ids = sum(len(p) for p in prompt if isinstance(p, list))  # several prompts of token ids
        return math.ceil(chars / CHARS_PER_TOKEN) + ids, len(prompt)
    return 0, 1


def request_cost(body: dict[str, Any], token_burst: float | None) -> RequestCost:
    """The tokens a request reserves; `token_burst`: its key's token bucket capacity here, None without a
    token limit (it only lowers chat's default reservation)."""
    prompt_tokens, num_prompts = prompt_estimate(body)
    choices = max(1, _count(body.get("n"))) * num_prompts
    stated = _count(body.get("max_completion_tokens")) or _count(body.get("max_tokens"))
    if stated:
        return RequestCost(prompt_tokens, stated * choices, True)
    if "messages" not in body:
        return RequestCost(prompt_tokens, DEFAULT_COMPLETION_OUTPUT_TOKENS * choices, False)
    output = DEFAULT_CHAT_OUTPUT_TOKENS * choices
    if token_burst is not None:  # a size nobody asked for never makes a request too large
        output = max(1, min(output, math.floor(token_burst) - prompt_tokens))
    return RequestCost(prompt_tokens, output, False)
