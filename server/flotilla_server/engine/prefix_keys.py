"""Which prefix keys this engine's prefix cache holds now: what the gateway's `prefix` routing reads from
each server's load report, so that every gateway replica sends a prompt where its blocks are cached
(docs/gateway.md, "Routing").

A gateway names each request's prefix with a key (flotilla_contract.load.PREFIX_KEY_HEADER). The engine
remembers, for each of the RECENT_KEYS most recently admitted keys, the hash of one block of that request's
prompt: the deepest full block within the first KEY_DEPTH_BLOCKS. A key is resident while the cache still
holds that block. Eviction frees a prefix's tail first, so a key stays resident while its head remains; the
block sits deep enough that a key whose whole span is gone is never reported.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from flotilla_server.engine.block_hash import BlockHash

RECENT_KEYS = 256  # keys remembered, most recently admitted kept
KEY_DEPTH_BLOCKS = 64  # the block checked is at most this deep (1,024 tokens at 16 per block)
REFRESH_S = 0.1  # the resident list is recomputed at most this often (it travels with every step's stats)


class PrefixKeyIndex:
    def __init__(self, capacity: int = RECENT_KEYS) -> None:
        self.capacity = capacity
        self._block_of: OrderedDict[str, BlockHash] = OrderedDict()  # key -> its block hash; oldest first

    def note(self, key: str, prompt_block_hashes: list[BlockHash]) -> None:
        """Remember `key` as naming a prompt whose full blocks hash to `prompt_block_hashes` (in order);
        a prompt with no full block names nothing worth routing to."""
        if not prompt_block_hashes:
            return
        self._block_of[key] = prompt_block_hashes[min(len(prompt_block_hashes), KEY_DEPTH_BLOCKS) - 1]
        self._block_of.move_to_end(key)
        while len(self._block_of) > self.capacity:
            self._block_of.popitem(last=False)

    def resident(self, is_cached: Callable[[BlockHash], bool]) -> tuple[str, ...]:
        """The remembered keys whose block is cached, most recently admitted first."""
        return tuple(k for k, h in reversed(self._block_of.items()) if is_cached(h))
