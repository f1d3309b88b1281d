"""Paged attention equals dense causal attention, for any mix of prefill chunks and decode rows."""

from __future__ import annotations

import random

import pytest
import torch
from flotilla_server.model import decode_ops
from flotilla_server.model.attention import AttentionBatch, group_decode_rows, paged_attention
from flotilla_server.model.kv_tensors import KVCacheTensors


def test_slot_mapping_follows_the_block_tables():
    b = AttentionBatch.build([3, 1], [5, 18], [[7], [2, 4, 9]], block_size=8, device="cpu")
    # seq 0: positions 2..4 in block 7; seq 1: position 17 is offset 1 of its third block (9)
    assert b.slot_mapping.tolist() == [58, 59, 60, 9 * 8 + 1]
    assert len(b.prefills) == 1 and b.decode_start == 3 and len(b.groups()) == 1


def test_decode_rows_group_by_length():
    assert group_decode_rows([10, 2, 9, 4, 1], rows_per_group=2) == [[0, 2], [3, 1], [4]]
    assert group_decode_rows([5] * 3) == [[0, 1, 2]]
    assert group_decode_rows([]) == []


@pytest.mark.parametrize("counts", [[3, 1, 7, 7, 2, 64, 33, 9, 1], list(range(1, 70)), [4] * 9])
@pytest.mark.parametrize("rows_per_group", [1, 8])
def test_decode_groups_partition_the_rows_longest_first(counts, rows_per_group):
    groups = group_decode_rows(counts, rows_per_group)
    assert sorted(i for g in groups for i in g) == list(range(len(counts)))
    assert all(len(g) <= rows_per_group for g in groups)
    flat = [counts[i] for g in groups for i in g]
    assert flat == sorted(flat, reverse=True)  # each group's first row is its longest


def test_a_short_block_table_is_refused():
    with pytest.raises(ValueError, match="blocks"):
        AttentionBatch.build([4], [20], [[0]], block_size=16, device="cpu")


def _dense_reference(q, k_seq, v_seq, context_len, query_len, scale):
    """q: [L, H, d]; k_seq, v_seq: [C, KV, d]; query i at position C - L + i sees keys <= it."""
    group = q.shape[1] // k_seq.shape[1]
    k = k_seq.repeat_interleave(group, dim=1)
    v = v_seq.repeat_interleave(group, dim=1)
    scores = torch.einsum("lhd,chd->hlc", q, k) * scale
    q_pos = torch.arange(context_len - query_len, context_len)[:, None]
    scores = scores.masked_fill(torch.arange(context_len)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hlc,chd->lhd", scores.softmax(-1), v)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("num_decode", [0, 5, 40])
def test_matches_dense_attention(heads, kv_heads, seed, num_decode):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    head_dim, block_size, num_blocks = 8, 4, 4096
    # (query_len, context_len): fresh prefills, continued chunks, then decodes of various lengths
    shapes = [(rng.randint(2, 9), 0) for _ in range(2)] + [(rng.randint(2, 6), rng.randint(1, 20))]
    if seed % 2 and num_decode:  # decodes only: the step without prefills
        shapes = []
    shapes = [(q, q + c) for q, c in shapes] + [(1, rng.randint(1, 200)) for _ in range(num_decode)]
    free = rng.sample(range(num_blocks), num_blocks)  # scattered, non-contiguous blocks
    tables = [[free.pop() for _ in range(-(-c // block_size))] for _, c in shapes]
    kv = KVCacheTensors(
        [torch.randn(num_blocks * block_size, kv_heads, head_dim, generator=gen)],
        [torch.randn(num_blocks * block_size, kv_heads, head_dim, generator=gen)],
        num_blocks, block_size,
    )
    k_cache, v_cache = kv.k[0], kv.v[0]
    total = sum(q for q, _ in shapes)
    q = torch.randn(total, heads, head_dim, generator=gen)
    k_new = torch.randn(total, kv_heads, head_dim, generator=gen)
    v_new = torch.randn(total, kv_heads, head_dim, generator=gen)

    batch = AttentionBatch.build([s[0] for s in shapes], [s[1] for s in shapes], tables, block_size, "cpu")
    kv.write(0, batch.slot_mapping, k_new, v_new)
    out = paged_attention(q, k_new, v_new, kv, 0, batch, scale=0.3)

    start = 0
    for (query_len, context_len), table in zip(shapes, tables, strict=True):
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(context_len)])
        expected = _dense_reference(q[start:start + query_len], k_cache[slots], v_cache[slots],
                                    context_len, query_len, 0.3)
        torch.testing.assert_close(out[start:start + query_len], expected, atol=1e-5, rtol=1e-5)
        start += query_len


@pytest.mark.skipif(not decode_ops.NATIVE, reason="the native kernels are not built (make setup builds them)")
def test_the_torch_paths_decode_groups_are_built_only_when_it_runs():
    """A float32 CPU decode step takes the native attention, which reads the block tables as they are: the torch
    path's padded groups are never built for it; a bfloat16 step builds them on first use, and the same rows."""
    kv = KVCacheTensors.allocate(1, 8, 4, 2, 16, torch.float32, "cpu")
    kv.k[0].normal_(), kv.v[0].normal_()
    batch = AttentionBatch.build([1, 1], [5, 9], [[1, 2], [3, 4, 5]], block_size=4, device="cpu")
    q = torch.randn(2, 4, 16)
    with torch.inference_mode():
        native = paged_attention(q, q[:, :2], q[:, :2], kv, 0, batch, 0.25)
        assert batch.decode_groups is None
        kv16 = KVCacheTensors(k=[kv.k[0].bfloat16()], v=[kv.v[0].bfloat16()], num_blocks=8, block_size=4)
        torch_path = paged_attention(q.bfloat16(), None, None, kv16, 0, batch, 0.25)
    assert batch.decode_groups is not None and len(batch.groups()) >= 1
    torch.testing.assert_close(torch_path.float(), native, atol=3e-2, rtol=3e-2)
