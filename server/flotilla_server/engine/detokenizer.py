"""Incremental detokenization that never emits half a character, with stop strings applied.

Tokens do not map to characters: a byte-level token may carry part of a UTF-8 sequence, and a
word-piece may change how its neighbour decodes. So each step decodes a small window of recent
tokens twice (before and after the new ones) and emits only the difference, holding it back
while it ends in U+FFFD (an incomplete character). Text that might be the start of a stop string
is held back too, until the next tokens settle it; a stop string itself is never emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from flotilla_server.engine.stopping import find_stop, partial_stop_len

REPLACEMENT_CHAR = "\ufffd"
PROMPT_CONTEXT_TOKENS = 6  # prompt tokens decoded with the output so leading spaces come out right


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_token_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0  # window start: decoded for context only
        self._read_offset = len(self._ids)  # tokens before this are already in `text`
        self._stop = tuple(stop)
        self.text = ""  # output text so far, settled characters only, cut before any stop string
        self._emitted = 0  # characters of `text` already handed out
        self.stopped = False  # a stop string matched

    def add(self, token_ids: Sequence[int]) -> str:
        """Feed new tokens; return the text that is now safe to emit (possibly empty)."""
        if self.stopped:
            return ""
        self._ids.extend(token_ids)
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return self._emit(final=False)  # an incomplete character: wait for more bytes
        self._append(new_text[len(prefix_text) :])
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of generation: everything still held back, but never an incomplete last character.

        Generation cut (max_tokens, EOS) in the middle of a multi-byte character leaves bytes that decode
        to U+FFFD; they are dropped, as OpenAI drops them, rather than shown as a replacement character.
        """
        if not self.stopped and self._read_offset < len(self._ids):
            prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
            new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
            self._append(new_text[len(prefix_text) :].rstrip(REPLACEMENT_CHAR))
            self._prefix_offset = self._read_offset = len(self._ids)
        return self._emit(final=True)

    def _append(self, delta: str) -> None:
        old_len = len(self.text)
        self.text += delta
        if self._stop:
            i = find_stop(self.text, self._stop, search_from=old_len)
            if i is not None:
                self.text = self.text[:i]
                self.stopped = True

    def _emit(self, final: bool) -> str:
        end = len(self.text)
        if not (final or self.stopped) and self._stop:
            end = max(self._emitted, end - partial_stop_len(self.text, self._stop))
        out = self.text[self._emitted : end]
        self._emitted = end
        return out
