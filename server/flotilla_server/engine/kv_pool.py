"""The paged KV pool's bookkeeping: fixed-size blocks, reference counts, a free list, a prefix cache.

Mechanism only. The scheduler asks (`can_allocate`, `can_grow`, `match_prefix`) and then acts
(`allocate`, `grow`, `take`, `free`); the pool never chooses whom to preempt. The tensors live in
`model/kv_tensors.py`; this module only hands out block ids.

Prefix caching (docs/architecture.md, "KV pool"), as vLLM's automatic prefix caching does it:

- a block in use is one with a ref_count above 0; every other block is free, cached or not;
- a full, computed block may be registered under its chained hash (`block_hash.py`);
- a freed block that holds a hash keeps it and joins the cached LRU list; it is handed out again
  only when no uncached block is free, least recently freed first, and then loses its hash;
- a new owner of a cached block takes it with `take` (ref_count + 1, out of the LRU list);
- only full blocks are registered, so a partly filled block is never shared.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence as Seq

from flotilla_server.engine.block_hash import BlockHash
from flotilla_server.engine.sequence import Sequence


class PoolExhausted(RuntimeError):
    """Raised when a caller acts without asking first; a scheduler bug, never a user error."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref_counts = [0] * num_blocks  # ref_count 0 means the block is in a free list
        self._free: deque[int] = deque(range(num_blocks))  # free, holding no hash
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free, holding a hash; oldest first
        self._hash_of: dict[int, BlockHash] = {}  # block id -> its hash, for registered blocks
        self._block_of: dict[BlockHash, int] = {}  # the inverse: one block per hash

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Free blocks that still hold a reusable prefix (they count as free)."""
        return len(self._cached_free)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    # --- plain allocation -----------------------------------------------------------------------

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > self.num_free_blocks:
            raise PoolExhausted(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        ids = [self._pop_free() for _ in range(num_blocks)]
        for i in ids:
            self._ref_counts[i] = 1
        return ids

    def _pop_free(self) -> int:
        if self._free:
            return self._free.popleft()
        i, _ = self._cached_free.popitem(last=False)  # evict the least recently freed cached block
        del self._block_of[self._hash_of.pop(i)]
        return i

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        """Blocks `seq` still needs so that its table covers `num_tokens` positions."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_to_grow(seq, num_tokens) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        seq.block_table.extend(self.allocate(self.blocks_to_grow(seq, num_tokens)))

    # --- prefix cache ---------------------------------------------------------------------------

    def match_prefix(self, hashes: Seq[BlockHash]) -> list[int]:
        """The blocks of the longest cached run of `hashes` from the start; nothing is taken."""
        if not self.enable_caching:
            return []
        ids: list[int] = []
        for h in hashes:
            i = self._block_of.get(h)
            if i is None:
                break
            ids.append(i)
        return ids

    def holds(self, block_hash: BlockHash) -> bool:
        """Whether some block, in use or cached free, holds `block_hash`."""
        return block_hash in self._block_of

    def num_free_in(self, block_ids: Seq[int]) -> int:
        """How many of `block_ids` are free (taking them uses up free blocks)."""
        return sum(1 for i in block_ids if self._ref_counts[i] == 0)

    def take(self, block_ids: Seq[int]) -> list[int]:
        """Become one more owner of cached blocks (from `match_prefix`); each owner frees them once."""
        for i in block_ids:
            if i not in self._hash_of:
                raise PoolExhausted(f"block {i} holds no cached prefix")
            if self._ref_counts[i] == 0:
                del self._cached_free[i]
            self._ref_counts[i] += 1
        return list(block_ids)

    def register(self, block_id: int, block_hash: BlockHash) -> None:
        """Record a full, computed, owned block under its hash; a hash already held keeps its block."""
        if not self.enable_caching or block_id in self._hash_of or block_hash in self._block_of:
            return
        if self._ref_counts[block_id] < 1:
            raise PoolExhausted(f"block {block_id} is free and cannot be registered")
        self._hash_of[block_id] = block_hash
        self._block_of[block_hash] = block_id

    # --- sharing and freeing --------------------------------------------------------------------

    def fork(self, block_ids: list[int]) -> list[int]:
        """Share blocks in use with another owner (n > 1); each owner frees them once."""
        for i in block_ids:
            if self._ref_counts[i] < 1:
                raise PoolExhausted(f"block {i} is free and cannot be shared")
            self._ref_counts[i] += 1
        return list(block_ids)

    def release(self, block_ids: Seq[int]) -> None:
        for i in block_ids:
            if self._ref_counts[i] < 1:
                raise PoolExhausted(f"block {i} released while free (double free)")
            self._ref_counts[i] -= 1
            if self._ref_counts[i] == 0:
                if i in self._hash_of:
                    self._cached_free[i] = None  # most recently freed: evicted last
                else:
                    self._free.append(i)

    def free(self, seq: Sequence) -> None:
        # last block first, so a prefix's tail is evicted before its head, as in vLLM
        self.release(seq.block_table[::-1])
        seq.block_table = []

    def check(self, tables: list[list[int]]) -> None:
        """Assert the pool's invariants against every live block table (tests and debugging)."""
        counts = [0] * self.num_blocks
        for table in tables:
            for i in table:
                counts[i] += 1
        free = set(self._free)
        assert len(free) == len(self._free), "a block is in the free list twice"
        assert not free & set(self._cached_free), "a block is in both free lists"
        free |= set(self._cached_free)
        assert set(self._cached_free) <= set(self._hash_of), "a cached free block holds no hash"
        assert not set(self._free) & set(self._hash_of), "an uncached free block holds a hash"
        assert len(self._hash_of) == len(self._block_of), "hash maps disagree"
        assert all(self._block_of[h] == i for i, h in self._hash_of.items()), "hash maps disagree"
        for i in range(self.num_blocks):
            assert counts[i] == self._ref_counts[i], f"block {i}: {counts[i]} owners, ref_count {self._ref_counts[i]}"
            assert (i in free) == (counts[i] == 0), f"block {i}: free-list membership disagrees with owners"
