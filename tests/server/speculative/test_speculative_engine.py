"""Speculative decoding on a real forward pass: the same greedy tokens as without it, every block given back, a
request's end (max_tokens, EOS, a stop string, an abort) never overtaken by its draft."""

from __future__ import annotations

import json

import pytest
from flotilla_server.engine.sampling_params import SamplingParams

from tests.server.engine.conftest import run_to_completion
from tests.support.hf_models import random_prompts

from .conftest import engine


def greedy(n: int, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **extra)


def repetitive_prompts() -> list[list[int]]:
    """Prompts whose continuations repeat what they hold, so that drafts are proposed and accepted."""
    return [[5, 6, 7, 8] * 12, [11, 12, 13] * 20 + [11], [40 + i % 9 for i in range(70)], [3] * 9,
            [*range(100, 140), *range(100, 130)]]


def check_blocks(eng) -> None:
    """The pool's refcounts match the running tables, and no sequence holds a block past its tokens."""
    running = eng.scheduler.running
    eng.pool.check([s.block_table for s in running])
    for s in running:
        assert len(s.block_table) <= eng.pool.blocks_for(s.num_tokens + 1), "a rejected token's block is held"


def run_checked(eng, requests: dict) -> dict:
    results = {rid: {"token_ids": [], "text": "", "finish_reason": None} for rid in requests}
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    while eng.has_unfinished():
        for out in eng.step():
            r = results[out.request_id]
            r["token_ids"] += out.token_ids
            r["text"] += out.text
            r["finish_reason"] = out.finish_reason if out.finished else None
        check_blocks(eng)
    assert eng.pool.num_free_blocks == eng.pool.num_blocks, "blocks leaked"
    eng.pool.check([])
    return results


@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_equals_greedy_without_speculation_on_many_prompts(llama, k) -> None:
    prompts = repetitive_prompts() + random_prompts([5, 30, 64, 17, 100, 9, 45], seed=k)
    requests = {f"r{i}": (p, greedy(24 + 5 * (i % 4))) for i, p in enumerate(prompts)}
    config = {"max_num_seqs": 6, "block_size": 4, "max_num_batched_tokens": 96, "prefill_chunk": 48}
    want = run_to_completion(engine(llama, **config), requests)
    spec = engine(llama, k, **config)
    got = run_checked(spec, requests)
    assert got == want
    stats = spec.stats()
    assert stats.spec_accepted_tokens > 20 and stats.spec_proposed_tokens > stats.spec_accepted_tokens


def test_tiny_model_greedy_equality_and_prefix_cache_reuse(tiny) -> None:
    prompts = repetitive_prompts() + random_prompts([12, 50], seed=9)
    requests = {f"r{i}": (p, greedy(40)) for i, p in enumerate(prompts)}
    spec = engine(tiny, 8, block_size=4)
    first = run_checked(spec, requests)
    assert first == run_to_completion(engine(tiny, block_size=4), requests)
    again = run_checked(spec, {f"again-{rid}": r for rid, r in requests.items()})  # from the cached blocks
    assert spec.stats().prefix_cache_hits > 0
    assert [r["token_ids"] for r in again.values()] == [r["token_ids"] for r in first.values()]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 9, 10, 17])
def test_max_tokens_is_never_passed(llama, max_tokens) -> None:
    requests = {"r": (repetitive_prompts()[0], greedy(max_tokens))}
    got = run_checked(engine(llama, 8), requests)
    assert got == run_to_completion(engine(llama), requests)
    assert len(got["r"]["token_ids"]) == max_tokens and got["r"]["finish_reason"] == "length"


def test_eos_inside_an_accepted_draft_ends_the_request_there(llama) -> None:
    prompt = repetitive_prompts()[1]
    plain = run_to_completion(engine(llama), {"r": (prompt, greedy(40))})["r"]["token_ids"]
    eos = plain[12]  # a token the continuation reaches, and that drafts carry
    results = []
    for eng in (engine(llama), engine(llama, 8)):
        eng.scheduler.eos_token_ids = frozenset({eos})
        results.append(run_checked(eng, {"r": (prompt, SamplingParams(max_tokens=40, temperature=0.0))})["r"])
    assert results[0] == results[1]
    assert results[1]["finish_reason"] == "stop" and results[1]["token_ids"][-1] == eos
    assert len(results[1]["token_ids"]) == plain.index(eos) + 1


@pytest.mark.parametrize("which", [1, 2])
def test_a_stop_string_inside_a_draft_cuts_the_tokens_after_it(llama, which) -> None:
    prompt = repetitive_prompts()[which]
    text = run_to_completion(engine(llama), {"r": (prompt, greedy(40))})["r"]["text"]
    # three printable characters first seen in the second half of the reply, where drafts are accepted
    at = next(i for i in range(len(text) // 2, len(text) - 3)
              if text[i:i + 3].isprintable() and text[i:i + 3] not in text[:i + 2])
    requests = {"r": (prompt, greedy(40, stop=(text[at:at + 3],)))}
    want = run_to_completion(engine(llama), requests)
    spec = engine(llama, 8)
    assert run_checked(spec, requests) == want
    assert want["r"]["finish_reason"] == "stop" and spec.stats().spec_accepted_tokens > 0


def test_an_abort_while_a_draft_is_verified_commits_nothing_and_frees_every_block(tiny) -> None:
    spec = engine(tiny, 8)
    spec.add_request("r", repetitive_prompts()[0], greedy(60))
    while not spec.scheduler.running or spec.scheduler.running[0].num_output_tokens < 10:
        spec.step()
    plan = spec.scheduler.schedule()
    assert plan.drafted(), "the step verifies a draft"
    result = spec.runner.execute(plan)
    seq = spec.scheduler.running[0]
    before = list(seq.output_token_ids)
    spec.abort("r")  # as the engine loop applies an abort that arrived during the forward pass
    assert spec.scheduler.update(plan, result.sampled_token_ids, result.num_accepted) == []
    assert seq.output_token_ids == before and seq.finish_reason == "abort"
    assert not spec.has_unfinished() and spec.pool.num_free_blocks == spec.pool.num_blocks


def test_a_request_that_opts_out_never_drafts(llama) -> None:
    spec = engine(llama, 8)
    requests = {"r": (repetitive_prompts()[0], greedy(30, speculative=False))}
    assert run_checked(spec, requests) == run_to_completion(engine(llama), requests)
    assert spec.stats().spec_drafts == 0


def test_logprobs_and_penalties_match_without_speculation(llama) -> None:
    params = greedy(30, logprobs=2, frequency_penalty=0.3, repetition_penalty=1.1)
    prompts = repetitive_prompts()[:3]
    outs = []
    for eng in (engine(llama), engine(llama, 6)):
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, params)
        got: dict[str, list] = {}
        while eng.has_unfinished():
            for out in eng.step():
                assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
                got.setdefault(out.request_id, []).extend(zip(out.token_ids, out.logprobs, strict=True))
        outs.append(got)
    plain, spec = outs
    for rid in plain:
        assert [t for t, _ in spec[rid]] == [t for t, _ in plain[rid]]
        for (_, a), (_, b) in zip(plain[rid], spec[rid], strict=True):
            assert abs(a.logprob - b.logprob) < 1e-4 and [i for i, _ in a.top] == [i for i, _ in b.top]


def test_seeded_sampling_with_n_choices_is_reproducible(tiny) -> None:
    params = SamplingParams(max_tokens=30, temperature=0.8, seed=7, n=3, ignore_eos=True)
    runs = []
    for _ in range(2):
        eng = engine(tiny, 8)
        eng.add_request("r", repetitive_prompts()[0], params)
        tokens: dict[int, list[int]] = {}
        while eng.has_unfinished():
            for out in eng.step():
                tokens.setdefault(out.index, []).extend(out.token_ids)
        runs.append(tokens)
        assert eng.pool.num_free_blocks == eng.pool.num_blocks and eng.runner.num_generators == 0
    assert runs[0] == runs[1] and sorted(runs[0]) == [0, 1, 2]
    assert all(len(t) == 30 for t in runs[0].values())


def test_a_constrained_request_never_drafts_and_its_neighbours_still_do(tiny) -> None:
    from flotilla_server.grammar.json_schema import schema_grammar

    schema = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "fox"]}}, "required": ["kind"],
              "additionalProperties": False}
    constrained = SamplingParams(max_tokens=40, temperature=0.0, grammar=schema_grammar(schema, "schema"))
    requests = {"json": (repetitive_prompts()[0], constrained), "free": (repetitive_prompts()[1], greedy(40))}
    spec = engine(tiny, 8)
    got = run_checked(spec, requests)
    assert got == run_to_completion(engine(tiny), requests)
    assert json.loads(got["json"]["text"])["kind"] in ("cat", "dog", "fox") and got["json"]["finish_reason"] == "stop"
    assert spec.stats().spec_accepted_tokens > 0  # from the unconstrained request alone
