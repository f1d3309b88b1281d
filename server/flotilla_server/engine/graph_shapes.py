"""Which decode steps replay a captured CUDA graph, and at which padded shape (pure; no torch).

Why: a decode step of a small batch on a GPU spends most of its time launching kernels, hundreds per
step, each a few microseconds of CPU for a few microseconds of GPU work. A CUDA graph replays the whole
step's kernels with one launch (vLLM and SGLang both capture their decode step). A graph replays fixed
shapes at fixed addresses, so a step is padded up to a captured shape: its rows to the next capture
size, and its gathered context to the next power-of-two count of blocks (the attention gathers every
row's blocks into one padded tensor, model/attention.py).

Rules:
- only pure decode steps (every sequence brings one token) are graphed; a step with any prefill chunk
  runs eagerly;
- sizes: 1, 2, 4, then every multiple of 8, up to `max_num_seqs` and `MAX_CAPTURE_SIZE`; a step of more
  rows runs eagerly;
- blocks: the step's longest row's blocks, rounded up to a power of two, at most the blocks of
  `max_model_len`;
- a shape whose gather (rows x blocks x block_size tokens) exceeds `gather_budget_tokens` runs eagerly:
  the graphs share one gather buffer of that many tokens, allocated once, so that a lazily captured
  graph never moves a buffer an earlier graph reads;
- at most `max_graphs` shapes are captured, first come first served; past that, new shapes run eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_CAPTURE_SIZE = 256
DEFAULT_GATHER_BUDGET_TOKENS = 65_536  # e.g. 64 rows at 1,024 tokens, 8 rows at 8,192
DEFAULT_MAX_GRAPHS = 64


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    top = min(max_num_seqs, MAX_CAPTURE_SIZE)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, top + 1, 8))
    if top not in sizes:
        sizes.append(top)
    return tuple(sizes)


def padded_rows(num_rows: int, sizes: Sequence[int]) -> int | None:
    """The smallest capture size that holds `num_rows`, or None (too many rows: eager)."""
    return next((s for s in sizes if s >= num_rows), None)


def padded_blocks(max_row_blocks: int, max_model_blocks: int) -> int:
    blocks = 1
    while blocks < max_row_blocks:
        blocks *= 2
    return min(blocks, max(max_model_blocks, max_row_blocks))


@dataclass(frozen=True)
class GraphShapes:
    """The shapes one engine may capture."""

    max_num_seqs: int
    max_model_len: int
    block_size: int
    gather_budget_tokens: int = DEFAULT_GATHER_BUDGET_TOKENS
    max_graphs: int = DEFAULT_MAX_GRAPHS

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_model_len, self.block_size, self.gather_budget_tokens) < 1:
            raise ValueError(f"every GraphShapes field must be >= 1, got {self}")
        if self.max_graphs < 0:
            raise ValueError(f"max_graphs must be >= 0, got {self.max_graphs}")

    @property
    def sizes(self) -> tuple[int, ...]:
        return capture_sizes(self.max_num_seqs)

    @property
    def max_model_blocks(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def shape_for(self, query_lens: Sequence[int], context_lens: Sequence[int]) -> tuple[int, int] | None:
        """(rows, blocks) of the graph a step replays, or None when it runs eagerly."""
        if not query_lens or any(q != 1 for q in query_lens):
            return None
        rows = padded_rows(len(query_lens), self.sizes)
        if rows is None:
            return None
        blocks = padded_blocks(max(-(-c // self.block_size) for c in context_lens), self.max_model_blocks)
        if rows * blocks * self.block_size > self.gather_budget_tokens:
            return None
        return rows, blocks

    def may_capture(self, captured: int) -> bool:
        """Whether a shape not captured yet may be, with `captured` graphs already held."""
        return captured < self.max_graphs
