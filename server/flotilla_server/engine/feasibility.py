"""Whether a request can ever run on an engine: a pure rule of its limits, torch-free.

The engine applies it when a request arrives, and the HTTP side applies it before it sends the request
(a 400 needs no round trip to the engine process).
"""

from __future__ import annotations


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def infeasible_reason(
    num_prompt_tokens: int, max_tokens: int, max_model_len: int, num_blocks: int, block_size: int,
    n: int = 1, num_slots: int | None = None,
) -> str | None:
    """Why a request could never run on this engine, phrased as what to change; None if it can.

    `n` choices of one prompt are admitted together, so they must fit the engine's `num_slots`."""
    if num_slots is not None and n > num_slots:
        return (f"n ({n}) asks for more choices of one prompt than this server runs at once ({num_slots} "
                "sequences); lower n")
    if num_prompt_tokens < 1:
        return "the prompt is empty; send at least one token"
    total = num_prompt_tokens + max_tokens
    if total > max_model_len:
        return (
            f"prompt ({num_prompt_tokens} tokens) plus max_tokens ({max_tokens}) is {total}, over the "
            f"model's context of {max_model_len} tokens; shorten the prompt or lower max_tokens"
        )
    needed = blocks_needed(num_prompt_tokens, max_tokens, block_size, n)
    if needed > num_blocks:
        choices = f" for {n} choices" if n > 1 else ""
        return (
            f"prompt plus max_tokens{choices} needs {needed} KV blocks but the pool has "
            f"{num_blocks}; lower max_tokens{' or n' if n > 1 else ''} or start the server with a larger KV cache"
        )
    return None


def blocks_needed(num_prompt_tokens: int, max_tokens: int, block_size: int, n: int = 1) -> int:
    """The blocks `n` choices hold at their longest: they run together, sharing the prompt's full blocks, and
    each owns the rest (the prompt's partial last block and its own tokens)."""
    total = blocks_for(num_prompt_tokens + max_tokens, block_size)
    return total + (n - 1) * (total - num_prompt_tokens // block_size)
