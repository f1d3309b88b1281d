"""The paged KV pool's bookkeeping: fixed-size blocks, reference counts, a free list.

Mechanism only. The scheduler asks (`can_allocate`, `can_grow`) and then acts (`allocate`,
`grow`, `free`); the pool never chooses whom to preempt. The tensors live in
`model/kv_tensors.py`; this module only hands out block ids.
"""

from __future__ import annotations

from collections import deque

from flotilla_server.engine.sequence import Sequence


class PoolExhausted(RuntimeError):
    """Raised when a caller acts without asking first; a scheduler bug, never a user error."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks  # ref_count 0 means the block is in the free list
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self._free):
            raise PoolExhausted(f"asked for {num_blocks} blocks, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(num_blocks)]
        for i in ids:
            self._ref_counts[i] = 1
        return ids

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its table covers `num_tokens` positions."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_to_grow(seq, num_tokens) <= len(self._free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        seq.block_table.extend(self.allocate(self.blocks_to_grow(seq, num_tokens)))

    def fork(self, block_ids: list[int]) -> list[int]:
        """Share blocks with another owner (prefix sharing); each owner frees them once."""
        for i in block_ids:
            if self._ref_counts[i] < 1:
                raise PoolExhausted(f"block {i} is free and cannot be shared")
            self._ref_counts[i] += 1
        return list(block_ids)

    def release(self, block_ids: list[int]) -> None:
        for i in block_ids:
            if self._ref_counts[i] < 1:
                raise PoolExhausted(f"block {i} released while free (double free)")
            self._ref_counts[i] -= 1
            if self._ref_counts[i] == 0:
                self._free.append(i)

    def free(self, seq: Sequence) -> None:
        self.release(seq.block_table)
        seq.block_table = []

    def check(self, tables: list[list[int]]) -> None:
        """Assert the pool's invariants against every live block table (tests and debugging)."""
        counts = [0] * self.num_blocks
        for table in tables:
            for i in table:
                counts[i] += 1
        free = set(self._free)
        assert len(free) == len(self._free), "a block is in the free list twice"
        for i in range(self.num_blocks):
            assert counts[i] == self._ref_counts[i], f"block {i}: {counts[i]} owners, ref_count {self._ref_counts[i]}"
            assert (i in free) == (counts[i] == 0), f"block {i}: free-list membership disagrees with owners"
