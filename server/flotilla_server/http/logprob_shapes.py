"""OpenAI's two shapes of log-probabilities, built from the engine's per-token `TokenLogprobs`.

- chat: `choices[].logprobs.content[]` of `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`,
  with exactly `top_logprobs` alternatives;
- completions (legacy): `choices[].logprobs` of parallel lists `tokens`, `token_logprobs`, `top_logprobs`
  (a dict of token text to logprob: the `logprobs` likeliest and the sampled token, so up to logprobs + 1
  entries, as OpenAI documents) and `text_offset` (each token's character offset in the choice's text).

A token's text is the token decoded alone, special tokens included, as vLLM shows it; a token holding
only part of a character decodes to U+FFFD, and `bytes` are the UTF-8 bytes of that text (vLLM's rule).
A logprob of -inf (a probability that underflowed) is sent as -9999.0, as vLLM does: JSON has no -inf.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flotilla_server.engine.outputs import TokenLogprobs

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
