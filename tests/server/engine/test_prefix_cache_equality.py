"""With prefix caching on, greedy output still equals transformers, for every architecture.

Three cases (docs/architecture.md, "KV pool"): a cold cache; a warm cache where a new request starts
from 1, 2 and 5 full blocks another request computed; and preemption of requests that share blocks.
The hit counters prove the cache was really used, so equality is not met by recomputing everything.
"""

from __future__ import annotations

import pytest
from flotilla_server.engine.sampling_params import SamplingParams

from tests.support.hf_models import hf_greedy, random_prompts

from .conftest import ARCH_CASES, make_engine, run_to_completion

CASES = sorted(ARCH_CASES)
BLOCK = 8


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run(engine, prompts, new_tokens) -> list[list[int]]:
    got = run_to_completion(engine, {f"r{i}": (p, greedy(n)) for i, (p, n) in enumerate(zip(prompts, new_tokens, strict=True))})
    return [got[f"r{i}"]["token_ids"] for i in range(len(prompts))]


@pytest.mark.parametrize("case", CASES)
def test_cold_then_warm_cache_sharing_1_2_and_5_blocks(hf_model, case) -> None:
    path, loaded = hf_model(case)
    engine = make_engine(loaded, max_num_seqs=4, max_num_batched_tokens=128, prefill_chunk=128, block_size=BLOCK)
    base = random_prompts([5 * BLOCK + 3], seed=11)[0]  # 5 full blocks and a partial one
    tails = random_prompts([5, 9, 4], seed=12)
    cold = run(engine, [base], [6])
    assert engine.stats().prefix_cache_hits == 0, "a cold cache hit"
    warm_prompts = [base[: k * BLOCK] + tail for k, tail in zip((1, 2, 5), tails, strict=True)]
    hits_before = engine.stats().prefix_cache_hits
    warm = []
    for prompt in warm_prompts:  # one at a time, so each hit is the run it shares with `base`
        warm += run(engine, [prompt], [6])
    assert engine.stats().prefix_cache_hits - hits_before == (1 + 2 + 5) * BLOCK
    assert cold + warm == hf_greedy(path, [base, *warm_prompts], 6)
    engine.pool.check([])
    assert engine.pool.num_used_blocks == 0 and engine.pool.num_cached_blocks > 0


@pytest.mark.parametrize("case", CASES)
def test_preemption_of_requests_holding_shared_blocks(hf_model, case) -> None:
    path, loaded = hf_model(case)
    # 3 sequences of a shared 32-token prefix (4 blocks) + 8 own tokens + 16 generated: 7 blocks each
    # alone, 4 + 3 x 3 = 13 with sharing; the pool has 10, so growth preempts sequences that share
    engine = make_engine(loaded, max_num_seqs=3, max_num_batched_tokens=256, prefill_chunk=64,
                         block_size=BLOCK, num_kv_blocks=10)
    shared = random_prompts([4 * BLOCK], seed=13)[0]
    prompts = [shared + tail for tail in random_prompts([8] * 3, seed=14)]
    run(engine, prompts[:1], [1])  # warms the cache with the shared prefix
    got = run(engine, prompts, [16] * 3)
    assert engine.scheduler.preemptions > 0
    assert engine.stats().prefix_cache_hits >= 3 * 4 * BLOCK
    assert got == hf_greedy(path, prompts, 16)
    engine.pool.check([])
