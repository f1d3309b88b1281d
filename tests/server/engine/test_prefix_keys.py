"""Which gateway prefix keys an engine reports as cached (engine/prefix_keys.py): a key is resident while
its prompt's blocks are, and not once they are evicted; the most recent keys come first; the list is bounded."""

from __future__ import annotations

from flotilla_server.engine.block_hash import extend_hashes
from flotilla_server.engine.kv_pool import BlockPool
from flotilla_server.engine.prefix_keys import KEY_DEPTH_BLOCKS, PrefixKeyIndex
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.scheduler import Scheduler
from flotilla_server.engine.sequence import Sequence

BLOCK = 2


def run(sched: Scheduler, request_id: str, prompt: list[int], key: str | None) -> None:
    sched.add(Sequence(request_id, prompt, SamplingParams(max_tokens=1, ignore_eos=True, prefix_key=key), ticket=-1))
    while sched.has_unfinished():
        plan = sched.schedule()
        sched.update(plan, [1 for c in plan.chunks if c.sample])


def test_a_key_is_resident_while_its_prompt_is_cached_and_not_after_eviction() -> None:
    pool = BlockPool(8, BLOCK)
    sched = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=16, prefill_chunk=16, reserve_blocks=0)
    run(sched, "a", [1, 2, 3, 4, 5, 6, 7], "tenant-a")
    run(sched, "b", [9, 9, 9, 9, 9], "tenant-b")
    assert sched.prefix_keys.resident(pool.holds) == ("tenant-b", "tenant-a")  # finished: blocks cached free
    run(sched, "c", list(range(20, 35)), None)  # 15 tokens: 8 blocks, the whole pool; evicts every cached block
    assert sched.prefix_keys.resident(pool.holds) == ()


def test_a_prompt_without_a_full_block_names_nothing() -> None:
    pool = BlockPool(8, BLOCK)
    sched = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=16, prefill_chunk=16, reserve_blocks=0)
    run(sched, "a", [1, 2], "short")  # its one full block holds the last token, which is never cached
    assert sched.prefix_keys.resident(pool.holds) == ()


def test_the_index_keeps_the_most_recent_keys_and_checks_a_block_at_most_the_depth_limit_deep() -> None:
    index = PrefixKeyIndex(capacity=3)
    hashes = extend_hashes([], list(range(2 * (KEY_DEPTH_BLOCKS + 10))), BLOCK, None)
    for key in ("k1", "k2", "k3", "k4"):
        index.note(key, hashes)
    index.note("k2", hashes)  # noted again: most recent
    assert index.resident(lambda h: True) == ("k2", "k4", "k3")
    assert index.resident(lambda h: h == hashes[KEY_DEPTH_BLOCKS - 1]) == ("k2", "k4", "k3")
    assert index.resident(lambda h: h == hashes[-1]) == ()
    index.note("k5", [])
    assert "k5" not in index.resident(lambda h: True)
