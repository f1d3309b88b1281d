"""What llguidance needs of a model's tokenizer: small, picklable, and the same for the probe and the engine."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import llguidance


@dataclass(frozen=True)
class GrammarTokenizer:
    tokenizer_json: str  # the model's tokenizer.json text (tokenizers' `Tokenizer.to_str()`)
    vocab_size: int  # the logits' width: the model's vocabulary, padding rows included
    eos_token_ids: tuple[int, ...]  # a finished grammar allows these, and nothing else

    @classmethod
    def of(cls, tokenizer: Any, model_vocab_size: int, eos_token_ids: Iterable[int]) -> GrammarTokenizer:
        """From a flotilla Tokenizer: the masks span the wider of the model's logits and the tokenizer's
        vocabulary (tokens past the logits are never sampled)."""
        return cls(tokenizer.to_json(), max(model_vocab_size, tokenizer.vocab_size), tuple(sorted(eos_token_ids)))

    def build(self) -> llguidance.LLTokenizer:
        """0.2-1 s for a 50k vocabulary: built once per process, on a thread that may wait for it."""
        return llguidance.LLTokenizer(self.tokenizer_json, n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids))


def parser_limits() -> llguidance.LLParserLimits:
    """llguidance's own bounds on a grammar's size and per-step work (its defaults), and errors that do not
    repeat the grammar: a schema must not leak into logs."""
    return llguidance.LLParserLimits(verbose_errors=False)


def new_matcher(tokenizer: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    """A matcher in its start state; check `is_error()`: llguidance never raises for a bad grammar."""
    return llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits())
