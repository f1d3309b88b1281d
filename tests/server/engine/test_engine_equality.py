"""Engine-level greedy output equals transformers, token for token, for every architecture.

The engine here is the whole path: scheduler, block pool, executor, sampling, stopping.
"""

from __future__ import annotations

import pytest
from flotilla_server.engine.sampling_params import SamplingParams

from tests.support.hf_models import hf_greedy, random_prompts

from .conftest import ARCH_CASES, make_engine, run_to_completion

CASES = sorted(ARCH_CASES)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def check(engine, path, prompts, new_tokens) -> None:
    requests = {f"r{i}": (p, greedy(n)) for i, (p, n) in enumerate(zip(prompts, new_tokens, strict=True))}
    got = run_to_completion(engine, requests)
    expected = hf_greedy(path, prompts, new_tokens)
    for i, want in enumerate(expected):
        assert got[f"r{i}"]["token_ids"] == want, f"request {i} (prompt {len(prompts[i])} tokens) differs"
        assert got[f"r{i}"]["finish_reason"] == "length"


@pytest.mark.parametrize("case", CASES)
def test_one_request_alone(hf_model, case) -> None:
    path, loaded = hf_model(case)
    check(make_engine(loaded, max_num_seqs=4, max_num_batched_tokens=64, prefill_chunk=64), path,
          random_prompts([21], seed=1), [16])


@pytest.mark.parametrize("case", CASES)
def test_sixteen_at_once_with_prompts_from_5_to_300(hf_model, case) -> None:
    path, loaded = hf_model(case)
    lengths = [5, 300, 17, 64, 65, 120, 8, 250, 33, 16, 199, 47, 90, 6, 150, 281]
    new_tokens = [6 + (i * 5) % 11 for i in range(16)]  # different lengths: sequences leave at different steps
    check(make_engine(loaded, max_num_seqs=16, max_num_batched_tokens=512, prefill_chunk=512), path,
          random_prompts(lengths, seed=2), new_tokens)


@pytest.mark.parametrize("case", CASES)
def test_prefill_chunk_shorter_than_the_prompt(hf_model, case) -> None:
    path, loaded = hf_model(case)
    engine = make_engine(loaded, max_num_seqs=4, max_num_batched_tokens=24, prefill_chunk=13, block_size=8)
    check(engine, path, random_prompts([70, 41, 9], seed=3), [8, 10, 6])


@pytest.mark.parametrize("case", CASES)
def test_pool_so_small_that_preemption_happens(hf_model, case) -> None:
    path, loaded = hf_model(case)
    # 6 sequences end at 40 + 24 = 64 positions: 8 blocks of 8 each, 48 in all; the pool has 14
    engine = make_engine(loaded, max_num_seqs=6, max_num_batched_tokens=256, prefill_chunk=64,
                         block_size=8, num_kv_blocks=14)
    check(engine, path, random_prompts([40] * 6, seed=4), [24] * 6)
    assert engine.scheduler.preemptions > 0
