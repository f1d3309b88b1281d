"""KV pool sizing (engine/pool_sizing.py, engine/memory_facts.py): on CPU the default pool stays within its
share of the container's memory less the weights, within every slot at the context limit and, with no memory
limit, within a quarter of MemAvailable and 1 GiB, so two servers on one host take at most half of it; on a
GPU it takes the share less weights, one profiled step and what others hold; the flags override in order; and
every refusal names the flag to change. The memory facts are read from cgroup and /proc/meminfo files."""

from __future__ import annotations

from pathlib import Path

import pytest
from flotilla_server.engine import memory_facts
from flotilla_server.engine.pool_sizing import (
    GIB,
    SHARE_SOURCE,
    SHARED_HOST_SOURCE,
    SLOTS_SOURCE,
    MemoryFacts,
    PoolPlan,
    plan_pool,
)
from hypothesis import given
from hypothesis import strategies as st

MIB = 1024**2
BLOCK = 16


def plan(facts: MemoryFacts, *, util: float = 0.9, seqs: int = 64, requested: int | None = None,
         context: int = 8192, per_block: int = MIB, blocks: int | None = None, memory: int | None = None) -> PoolPlan:
    return plan_pool(num_kv_blocks=blocks, kv_cache_memory_bytes=memory, gpu_memory_utilization=util,
                     max_num_seqs=seqs, block_size=BLOCK, requested_max_model_len=requested, model_context=context,
                     bytes_per_block=per_block, facts=facts)


def cpu(capacity_gib: float, weights_gib: float, *, limited: bool = True) -> MemoryFacts:
    """A CPU engine's facts: by default in a container whose memory limit binds."""
    return MemoryFacts(on_gpu=False, capacity_bytes=int(capacity_gib * GIB), weights_bytes=int(weights_gib * GIB),
                       capacity_is_limit=limited)


# (case, facts, --max-num-seqs, the pool in 1 MiB blocks, the bound that sized it); context 8,192 tokens, so
# 64 slots at the context limit are 64 × 512 blocks
DEFAULT_POOLS = [
    ("a pod's 8 Gi limit: its share less the weights", cpu(8, 1), 64, int(0.9 * 8 * GIB - GIB) // MIB, SHARE_SOURCE),
    ("a big limit: every slot at the context", cpu(512, 1), 64, 64 * 512, SLOTS_SOURCE),
    ("no limit, 2 GiB available: a quarter of it", cpu(2, 0.5, limited=False), 64, 512, SHARED_HOST_SOURCE),
    ("no limit, 8 GiB available: 1 GiB", cpu(8, 1, limited=False), 64, 1024, SHARED_HOST_SOURCE),
    ("no limit, a big box: still 1 GiB", cpu(512, 1, limited=False), 64, 1024, SHARED_HOST_SOURCE),
    ("no limit, weights leave less than a quarter", cpu(2, 1.5, limited=False), 64, int(0.9 * 2 * GIB - 1.5 * GIB) // MIB,
     SHARE_SOURCE),
    ("no limit, few slots bind first", cpu(24, 1, limited=False), 1, 512, SLOTS_SOURCE),
]


@pytest.mark.parametrize(("facts", "seqs", "blocks", "source"), [c[1:] for c in DEFAULT_POOLS],
                         ids=[c[0] for c in DEFAULT_POOLS])
def test_the_default_cpu_pool_is_the_least_of_its_bounds(facts, seqs, blocks, source) -> None:
    assert plan(facts, seqs=seqs) == PoolPlan(blocks, min(8192, blocks * BLOCK), source)


def test_with_no_limit_the_flags_still_take_more_than_a_quarter() -> None:
    shared = cpu(24, 1, limited=False)
    assert plan(shared, memory=12 * GIB) == PoolPlan(12 * 1024, 8192, "--kv-cache-memory")
    assert plan(shared, util=0.05).source == SHARE_SOURCE  # --gpu-memory-utilization only lowers it
    with pytest.raises(ValueError, match="lower --kv-cache-memory"):
        plan(shared, memory=25 * GIB)  # still never more than what is available


def test_a_tiny_host_with_no_limit_is_refused_naming_the_quarter_and_the_flag() -> None:
    with pytest.raises(ValueError, match=r"with no memory limit, at most 25% of MemAvailable.*--kv-cache-memory"):
        plan(cpu(2 * MIB / GIB, 0, limited=False), per_block=MIB)


@given(available=st.integers(1 * GIB, 1024 * GIB), second_sees=st.floats(0.0, 1.0),
       weights_share=st.floats(0.0, 0.85), util=st.floats(0.05, 1.0), seqs=st.integers(1, 256),
       per_block=st.integers(1024, 64 * MIB))
def test_with_no_limit_two_servers_pools_take_at_most_half_of_what_was_available(
        available, second_sees, weights_share, util, seqs, per_block) -> None:
    """Started at once, both read the same MemAvailable; started one after the other, the second reads less."""
    pools = []
    for seen in (available, max(1, int(second_sees * available))):
        facts = MemoryFacts(on_gpu=False, capacity_bytes=seen, weights_bytes=int(weights_share * util * seen))
        try:
            p = plan(facts, util=util, seqs=seqs, per_block=per_block, context=4096)
        except ValueError as refused:
            assert "--kv-cache-memory" in str(refused)
            continue
        assert p.num_blocks * per_block <= min(seen / 4, GIB)
        pools.append(p.num_blocks * per_block)
    assert sum(pools) <= available / 2


def test_on_cpu_the_pool_never_exceeds_every_slot_at_the_context_limit() -> None:
    p = plan(cpu(512, 1), seqs=4, requested=1000)
    assert p.num_blocks == 4 * 63  # 1,000 tokens take 63 blocks of 16
    assert p.max_model_len == 1000


def test_on_a_gpu_the_share_less_weights_one_step_and_others_is_taken_whole() -> None:
    facts = MemoryFacts(on_gpu=True, capacity_bytes=80 * GIB, weights_bytes=2 * GIB,
                        activation_bytes=3 * GIB, others_bytes=GIB)
    p = plan(facts, seqs=4, requested=1000)
    assert p.num_blocks == int(0.9 * 80 * GIB - 6 * GIB) // MIB  # no slot cap, no quarter: the GPU is the engine's
    assert p.max_model_len == 1000


@given(capacity=st.integers(1 * GIB, 1024 * GIB), weights_share=st.floats(0.0, 0.85),
       util=st.floats(0.05, 1.0), seqs=st.integers(1, 256), per_block=st.integers(1024, 64 * MIB),
       limited=st.booleans())
def test_the_default_cpu_pool_stays_within_its_share_and_its_slots(capacity, weights_share, util, seqs,
                                                                   per_block, limited) -> None:
    facts = MemoryFacts(on_gpu=False, capacity_bytes=capacity, weights_bytes=int(weights_share * util * capacity),
                        capacity_is_limit=limited)
    try:
        p = plan(facts, util=util, seqs=seqs, per_block=per_block, context=4096)
    except ValueError as refused:
        assert "--gpu-memory-utilization" in str(refused) or "--max-model-len" in str(refused)
        return
    assert p.num_blocks * per_block <= util * capacity - facts.weights_bytes
    assert p.num_blocks <= seqs * (4096 // BLOCK)
    assert p.max_model_len == min(4096, p.num_blocks * BLOCK)


def test_the_flags_override_in_order_blocks_then_memory_then_the_share() -> None:
    facts = cpu(8, 1)
    assert plan(facts, blocks=100, memory=GIB) == PoolPlan(100, 1600, "--num-kv-blocks")
    assert plan(facts, memory=GIB) == PoolPlan(1024, 8192, "--kv-cache-memory")


def test_a_kv_cache_larger_than_the_memory_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"more than the .* bytes of memory this engine may use; lower --kv-cache-memory"):
        plan(cpu(8, 1), memory=9 * GIB)


def test_weights_that_leave_no_memory_are_refused_naming_the_flags() -> None:
    with pytest.raises(ValueError, match=r"no memory is left for the KV cache.*raise --gpu-memory-utilization.*"
                                          r"--kv-cache-memory"):
        plan(cpu(8, 7.5))


def test_a_max_model_len_whose_one_sequence_does_not_fit_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"--max-model-len 2048 does not fit: the KV pool .* holds 1600 tokens.*"
                                          r"lower --max-model-len"):
        plan(cpu(8, 1), blocks=100, requested=2048)


def test_a_max_model_len_beyond_the_model_context_is_refused_not_cut() -> None:
    with pytest.raises(ValueError, match=r"--max-model-len 9000 is outside the model.s context of 1\.\.8192"):
        plan(cpu(8, 1), requested=9000)


def test_unset_max_model_len_is_the_context_capped_by_what_the_pool_holds() -> None:
    assert plan(cpu(8, 1), blocks=100).max_model_len == 1600  # not refused: nothing was asked
    assert plan(cpu(8, 1), blocks=1000).max_model_len == 8192


def test_the_log_line_gives_tokens_size_source_and_concurrency() -> None:
    line = PoolPlan(8192, 2048, "--gpu-memory-utilization").describe(BLOCK, 32 * 1024)
    assert line == ("KV pool: 8192 blocks = 131072 tokens (0.25 GiB, sized by --gpu-memory-utilization); "
                    "64.00 sequences at the full --max-model-len of 2048 tokens")


@pytest.mark.parametrize(("v2", "v1", "limit"), [
    ("max\n", None, None),  # cgroup v2, no limit
    ("8589934592\n", None, 8 * GIB),  # a pod with an 8 Gi limit
    (None, "9223372036854771712\n", None),  # cgroup v1's "no limit"
    (None, "4294967296\n", 4 * GIB),
    (None, None, None),  # no cgroup files: a bare host
])
def test_the_cgroup_limit_is_read_from_v2_then_v1(tmp_path: Path, v2, v1, limit) -> None:
    paths = (tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes")
    for path, text in zip(paths, (v2, v1), strict=True):
        if text is not None:
            path.write_text(text)
    assert memory_facts.cgroup_limit_bytes(paths) == limit


def test_mem_available_is_read_in_bytes_and_its_absence_names_the_flag(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    assert memory_facts.mem_available_bytes(meminfo) == 20000000 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")
    with pytest.raises(RuntimeError, match="set --kv-cache-memory"):
        memory_facts.mem_available_bytes(meminfo)


@pytest.mark.parametrize(("limit", "capacity"), [
    (8 * GIB, (8 * GIB, True)),  # the container's own memory
    (64 * GIB, (20 * GIB, False)),  # a limit above what is free does not bind: the host's memory, shared
    (None, (20 * GIB, False)),
])
def test_the_host_capacity_is_the_lower_of_the_limit_and_what_is_available(monkeypatch, limit, capacity) -> None:
    monkeypatch.setattr(memory_facts, "mem_available_bytes", lambda: 20 * GIB)
    monkeypatch.setattr(memory_facts, "cgroup_limit_bytes", lambda: limit)
    assert memory_facts.host_capacity() == capacity
