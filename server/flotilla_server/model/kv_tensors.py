"""KVCacheTensors: the tensors behind the paged KV pool.

The block pool (kv_pool.py) owns block ids and reference counts; this module owns the memory they
name. Slot `s` of the pool is row `s` of every layer's K and V tensor, and block `b` covers slots
`[b * block_size, (b + 1) * block_size)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class KVCacheTensors:
    k: list[torch.Tensor]  # per layer: [num_blocks * block_size, kv_heads, head_dim]
    v: list[torch.Tensor]
    num_blocks: int
    block_size: int
    # gather buffers for K and V, reused by every layer and step: a fresh multi-MB tensor per layer
    # costs page faults (the allocator returns large blocks to the OS) that took 2/3 of decode time
    _scratch: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @classmethod
    def allocate(
        cls,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> KVCacheTensors:
        # zeros, not empty: padded gathers read unwritten slots, and masked scores must stay finite
        shape = (num_blocks * block_size, kv_heads, head_dim)
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return cls(k, v, num_blocks, block_size)

    def release(self) -> None:
        """Free the pool's memory now, whoever still holds these tensors (a parked engine's closed loop, freed
        by the garbage collector later): every storage shrinks to nothing. The pool is unusable after."""
        for t in (*self.k, *self.v, *(self._scratch or ())):
            t.untyped_storage().resize_(0)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """Memory one block takes over all layers, K and V: sizes the pool from a byte budget."""
        element_bytes = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * kv_heads * head_dim * element_bytes

    @staticmethod
    def gather_buffers(gather_tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                       device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V gather buffers for `gather_tokens` tokens, for `sharing`."""
        size = gather_tokens * kv_heads * head_dim
        return (torch.empty(size, dtype=dtype, device=device), torch.empty(size, dtype=dtype, device=device))

    def sharing(self, gather: tuple[torch.Tensor, torch.Tensor]) -> KVCacheTensors:
        """The same pool gathering into `gather` (from `gather_buffers`), which is never grown or replaced:
        for captured graphs (engine/decode_graphs.py), which must read one address for ever."""
        return KVCacheTensors(self.k, self.v, self.num_blocks, self.block_size, gather)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    def gather_blocks(self, layer: int, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the listed blocks, each [len(block_ids), block_size * kv_heads * head_dim].
        The result lives in shared scratch buffers: valid until the next call."""
        k, v = self.k[layer], self.v[layer]
        row = self.block_size * k.shape[1] * k.shape[2]
        n = block_ids.shape[0]
        if self._scratch is None or self._scratch[0].numel() < n * row:
            size = max(n * row, 2 * self._scratch[0].numel() if self._scratch else 0)
            self._scratch = (k.new_empty(size), v.new_empty(size))
        k_out = self._scratch[0][: n * row].view(n, row)
        v_out = self._scratch[1][: n * row].view(n, row)
        # row gathers on a [num_blocks, row] view: several times faster than on the 3-d view
        torch.index_select(k.view(-1, row), 0, block_ids, out=k_out)
        torch.index_select(v.view(-1, row), 0, block_ids, out=v_out)
        return k_out, v_out

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores this step's new K/V rows ([T, kv_heads, head_dim]) at their pool slots."""
        self.k[layer].index_copy_(0, slot_mapping, k)
        self.v[layer].index_copy_(0, slot_mapping, v)
