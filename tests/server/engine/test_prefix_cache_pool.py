"""Properties of the block pool with prefix caching, under any interleaving of add, fork, abort and preempt.

Owners are simulated the way the scheduler uses the pool: an owner takes the longest cached run of its
prompt's block hashes, allocates the rest, registers the blocks it fills, and frees its table on abort
or preemption. After every operation `BlockPool.check` proves that no block has two lives and every
ref_count equals its owners; eviction is watched directly; at the end every block is free again.
"""

from __future__ import annotations

from flotilla_server.engine.block_hash import extend_hashes
from flotilla_server.engine.kv_pool import BlockPool
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.scheduler import Scheduler
from flotilla_server.engine.sequence import Sequence
from hypothesis import given, settings
from hypothesis import strategies as st

BLOCK = 2
PREFIXES = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [7, 7, 7, 7, 7, 7, 7]]  # overlapping, so runs partly match

op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, len(PREFIXES) - 1), st.integers(0, 5), st.sampled_from([None, "a"])),
    st.tuples(st.just("fork"), st.integers(0, 99)),
    st.tuples(st.just("abort"), st.integers(0, 99)),
    st.tuples(st.just("preempt"), st.integers(0, 99)),
)


@settings(max_examples=400, deadline=None)
@given(num_blocks=st.integers(3, 24), ops=st.lists(op, max_size=60))
def test_any_interleaving_keeps_refcounts_exact_and_leaks_nothing(num_blocks, ops) -> None:
    pool = BlockPool(num_blocks, BLOCK)
    owners: list[list[int]] = []  # live block tables
    for o in ops:
        if o[0] == "add":
            _, which, extra, salt = o
            tokens = PREFIXES[which] + [100 + extra] * extra
            hashes = extend_hashes([], tokens, BLOCK, salt)
            hit = pool.match_prefix(hashes[: (len(tokens) - 1) // BLOCK])
            need = pool.blocks_for(len(tokens)) - len(hit)
            if need + pool.num_free_in(hit) > pool.num_free_blocks:
                continue  # ask, then act: the scheduler would defer it
            uncached_free = pool.num_free_blocks - pool.num_cached_blocks
            cached_before = pool.num_cached_blocks - pool.num_free_in(hit)
            table = pool.take(hit) + pool.allocate(need)
            # cached blocks are evicted only when no uncached block is left
            evicted = cached_before - pool.num_cached_blocks
            assert evicted == max(0, need - uncached_free)
            for i in range(len(hit), len(tokens) // BLOCK):  # the owner computed these full blocks
                pool.register(table[i], hashes[i])
            owners.append(table)
        elif owners:
            table = owners[o[1] % len(owners)]
            if o[0] == "fork":
                owners.append(pool.fork(table))
            else:  # abort and preempt both give every block back once
                owners.remove(table)
                pool.release(table[::-1])
        pool.check(owners)
    for table in owners:
        pool.release(table)
    pool.check([])
    assert pool.num_used_blocks == 0 and pool.num_free_blocks == num_blocks


@settings(max_examples=150, deadline=None)
@given(
    num_blocks=st.integers(6, 40),
    requests=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(1, 12)), min_size=1, max_size=12),
    eos_every=st.integers(2, 9),
)
def test_scheduler_with_shared_prefixes_finishes_everything_and_frees_every_block(num_blocks, requests, eos_every) -> None:
    pool = BlockPool(num_blocks, BLOCK)
    sched = Scheduler(pool, max_num_seqs=4, max_num_batched_tokens=16, prefill_chunk=5, eos_token_ids=[0])
    for i, (which, extra, max_tokens) in enumerate(requests):
        prompt = PREFIXES[which] + [50 + i] * extra
        if pool.blocks_for(len(prompt) + max_tokens) <= num_blocks:
            sched.add(Sequence(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), ticket=-1))
    steps = 0
    while sched.has_unfinished():
        steps += 1
        assert steps < 2000, "no progress"
        plan = sched.schedule()
        pool.check([s.block_table for s in sched.running])
        sched.update(plan, [1 + (steps % eos_every) for c in plan.chunks if c.sample])
    pool.check([])
    assert pool.num_used_blocks == 0
    assert sched.prefix_cache_hits <= sched.prefix_cache_queries


def test_with_caching_off_nothing_is_registered_or_matched() -> None:
    pool = BlockPool(4, BLOCK, enable_caching=False)
    hashes = extend_hashes([], PREFIXES[0], BLOCK, None)
    table = pool.allocate(3)
    for block_id, h in zip(table, hashes, strict=True):
        pool.register(block_id, h)
    pool.release(table)
    assert pool.match_prefix(hashes) == [] and pool.num_cached_blocks == 0


def test_a_salt_changes_every_block_hash_and_an_evicted_block_is_no_longer_matched() -> None:
    assert not set(extend_hashes([], PREFIXES[0], BLOCK, "a")) & set(extend_hashes([], PREFIXES[0], BLOCK, "b"))
    pool = BlockPool(3, BLOCK)
    hashes = extend_hashes([], PREFIXES[0], BLOCK, None)
    table = pool.allocate(3)
    for block_id, h in zip(table, hashes, strict=True):
        pool.register(block_id, h)
    pool.release(table[::-1])
    assert pool.match_prefix(hashes) == table and pool.num_cached_blocks == 3
    # nothing uncached is free: the least recently freed cached block goes, and a table is freed tail
    # first, so the prefix's last block is evicted before its head
    pool.allocate(1)
    assert pool.match_prefix(hashes) == table[:2]
    pool.allocate(1)
    assert pool.match_prefix(hashes) == table[:1]
