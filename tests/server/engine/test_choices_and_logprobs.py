"""n choices per prompt, lists of prompts and logprobs, on the engine with a real model, against transformers.

`n` choices fork from one prefill and share its full prompt blocks (prefix caching off here, so the
sharing is the fork's, not the cache's); logprobs are the raw log_softmax of the model's logits.
"""

from __future__ import annotations

import pytest
import torch
from flotilla_server.engine.sampling_params import SamplingParams

from tests.support.hf_models import hf_greedy, random_prompts

from .conftest import make_engine

BLOCK = 8


def run(engine, rid: str, prompts: list[list[int]], params: SamplingParams) -> tuple[dict[int, dict], int]:
    """Steps one request to its end; returns per choice index its tokens, logprobs and finish reason, and the
    most KV blocks in use at once."""
    engine.add_request(rid, prompts[0], params, extra_prompts=prompts[1:])
    choices: dict[int, dict] = {}
    peak = 0
    while engine.has_unfinished():
        for out in engine.step():
            c = choices.setdefault(out.index, {"token_ids": [], "logprobs": [], "finish_reason": None})
            c["token_ids"] += out.token_ids
            c["logprobs"] += out.logprobs or []
            c["finish_reason"] = out.finish_reason
        peak = max(peak, engine.pool.num_used_blocks)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks, "blocks leaked"
    return choices, peak


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def llama(hf_model):
    return hf_model("llama")


def test_n_4_greedy_choices_equal_transformers_and_use_under_1_5x_the_blocks_of_n_1(llama) -> None:
    path, loaded = llama
    prompt = random_prompts([10 * BLOCK + 3], seed=21)[0]  # 10 full blocks and a partial one
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "prefill_chunk": 256, "block_size": BLOCK,
              "enable_prefix_caching": False}
    one, peak_1 = run(make_engine(loaded, **config), "a", [prompt], greedy(6))
    four, peak_4 = run(make_engine(loaded, **config), "a", [prompt], greedy(6, n=4))
    want = hf_greedy(path, [prompt], 6)[0]
    assert one[0]["token_ids"] == want
    assert sorted(four) == [0, 1, 2, 3] and all(c["token_ids"] == want for c in four.values())
    assert all(c["finish_reason"] == "length" for c in four.values())
    assert peak_4 < 1.5 * peak_1, f"n=4 held {peak_4} blocks at once, n=1 {peak_1}: the prompt was not shared"


def test_a_list_of_prompts_numbers_its_choices_prompt_times_n_plus_j(llama) -> None:
    path, loaded = llama
    prompts = random_prompts([13, 30, 5], seed=22)
    engine = make_engine(loaded, max_num_seqs=4, max_num_batched_tokens=128, prefill_chunk=128, block_size=BLOCK)
    got, _ = run(engine, "a", prompts, greedy(4, n=2))  # 6 choices on 4 slots: the third prompt waits its turn
    want = hf_greedy(path, prompts, 4)
    assert {i: c["token_ids"] for i, c in got.items()} == {p * 2 + j: want[p] for p in range(3) for j in range(2)}


def test_seeded_choices_differ_from_each_other_and_repeat(llama) -> None:
    _, loaded = llama
    prompt = random_prompts([20], seed=23)[0]
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=7, n=3, ignore_eos=True)
    first, _ = run(make_engine(loaded, block_size=BLOCK), "a", [prompt], params)
    again, _ = run(make_engine(loaded, block_size=BLOCK), "b", [prompt], params)
    texts = [tuple(first[i]["token_ids"]) for i in range(3)]
    assert len(set(texts)) == 3, "the choices of one seeded request are all the same"
    assert texts == [tuple(again[i]["token_ids"]) for i in range(3)]


def test_preempting_choices_that_share_blocks_keeps_greedy_equality_and_frees_every_block(llama) -> None:
    path, loaded = llama
    prompts = random_prompts([20, 27], seed=24)
    # 2 prompts x 3 choices ending at 32 and 39 positions (8 and 10 blocks of 4): 24 blocks cannot hold all six
    engine = make_engine(loaded, max_num_seqs=6, max_num_batched_tokens=256, prefill_chunk=256, block_size=4,
                         num_kv_blocks=24)
    got, _ = run(engine, "a", prompts, greedy(12, n=3))
    want = hf_greedy(path, prompts, 12)
    assert {i: c["token_ids"] for i, c in got.items()} == {p * 3 + j: want[p] for p in range(2) for j in range(3)}
    assert engine.scheduler.preemptions > 0


def hf_log_softmax(path, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), vocab]: transformers' log_softmax of the logits that predicted each output token."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(output)], dim=-1)


def test_greedy_logprobs_equal_transformers_log_softmax_and_top_logprobs_are_sorted(llama) -> None:
    path, loaded = llama
    prompt = random_prompts([25], seed=25)[0]
    got, _ = run(make_engine(loaded, block_size=BLOCK), "a", [prompt], greedy(8, logprobs=5))
    tokens, logprobs = got[0]["token_ids"], got[0]["logprobs"]
    assert len(logprobs) == len(tokens) == 8
    want = hf_log_softmax(path, prompt, tokens)
    for t, (token, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        assert abs(lp.logprob - want[t, token].item()) < 1e-4
        assert len(lp.top) == 5 and lp.top[0] == (token, lp.logprob)  # greedy: the sampled token is the likeliest
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        top_lp, top_ids = want[t].topk(5)
        assert [i for i, _ in lp.top] == top_ids.tolist()
        assert max(abs(v - w) for (_, v), w in zip(lp.top, top_lp.tolist(), strict=True)) < 1e-4


def test_logprobs_are_raw_whatever_the_penalties_and_temperature(llama) -> None:
    _, loaded = llama
    prompt = random_prompts([25], seed=26)[0]
    plain, _ = run(make_engine(loaded, block_size=BLOCK), "a", [prompt], greedy(1, logprobs=3))
    shaped = SamplingParams(max_tokens=1, temperature=0.3, repetition_penalty=1.8, top_k=2, seed=1, logprobs=3)
    sampled, _ = run(make_engine(loaded, block_size=BLOCK), "b", [prompt], shaped)
    assert sampled[0]["logprobs"][0].top == plain[0]["logprobs"][0].top
    none, _ = run(make_engine(loaded, block_size=BLOCK), "c", [prompt], greedy(2))
    assert none[0]["logprobs"] == []  # not asked: none computed
