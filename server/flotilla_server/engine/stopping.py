"""When a sequence stops: EOS (unless ignore_eos), max_tokens, and stop strings.

Pure functions. Token-level checks run in the scheduler's update; stop strings need text,
so the detokenizer applies them (see detokenizer.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from flotilla_server.engine.sampling_params import SamplingParams


def token_finish_reason(
    token_id: int, num_output_tokens: int, params: SamplingParams, eos_token_ids: Collection[int]
) -> str | None:
    """Finish reason after `token_id` became output token number `num_output_tokens`, or None."""
    if not params.ignore_eos and token_id in eos_token_ids:
        return "stop"
    if num_output_tokens >= params.max_tokens:
        return "length"
    return None


def find_stop(text: str, stops: Sequence[str], search_from: int = 0) -> int | None:
    """Index of the earliest stop-string match that ends after `search_from`, or None."""
    best: int | None = None
    for s in stops:
        i = text.find(s, max(0, search_from - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string.

    That suffix must be held back: the next token may complete the stop string.
    """
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest
