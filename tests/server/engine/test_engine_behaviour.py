"""EngineCore behaviour beyond greedy equality: seeds, stop strings, EOS, cancellation, refusals."""

from __future__ import annotations

import pytest
from flotilla_server.engine.sampling_params import SamplingParams

from tests.support.hf_models import random_prompts

from .conftest import make_engine, run_to_completion


@pytest.fixture(scope="module")
def llama(hf_model):
    return hf_model("llama")[1]


def test_seeded_sampling_is_reproducible_whatever_the_batch(llama) -> None:
    prompt = random_prompts([30], seed=5)[0]
    seeded = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    alone = run_to_completion(make_engine(llama, max_num_seqs=8), {"s": (prompt, seeded)})["s"]["token_ids"]
    others = {f"o{i}": (p, SamplingParams(max_tokens=30, temperature=1.0, ignore_eos=True))
              for i, p in enumerate(random_prompts([12, 50, 7], seed=6))}
    crowd = run_to_completion(make_engine(llama, max_num_seqs=8, seed=99), {**others, "s": (prompt, seeded)})
    assert crowd["s"]["token_ids"] == alone
    other_seed = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, seed=4321, ignore_eos=True)
    differs = run_to_completion(make_engine(llama, max_num_seqs=8), {"s": (prompt, other_seed)})
    assert differs["s"]["token_ids"] != alone


def test_stop_string_ends_generation_before_it(llama) -> None:
    prompt = random_prompts([20], seed=7)[0]
    full = run_to_completion(make_engine(llama), {"a": (prompt, SamplingParams(max_tokens=40, temperature=0.0,
                                                                              ignore_eos=True))})["a"]
    text = full["text"]
    assert len(text) > 12, "the reference text is too short for this test"
    stop = text[8:11]
    cut = text.find(stop)
    got = run_to_completion(make_engine(llama), {"a": (prompt, SamplingParams(
        max_tokens=40, temperature=0.0, ignore_eos=True, stop=["never-there", stop]))})["a"]
    assert got["text"] == text[:cut] and got["finish_reason"] == "stop"
    assert full["token_ids"][: len(got["token_ids"])] == got["token_ids"]
    assert len(got["token_ids"]) < len(full["token_ids"])


def test_eos_stops_unless_ignored_and_has_no_text(llama) -> None:
    prompt = random_prompts([15], seed=8)[0]
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    ref = run_to_completion(make_engine(llama), {"a": (prompt, SamplingParams(max_tokens=12, temperature=0.0,
                                                                             ignore_eos=True))})["a"]
    eos = ref["token_ids"][4]
    first = ref["token_ids"].index(eos)
    engine = make_engine(llama)
    engine.scheduler.eos_token_ids = frozenset({eos})  # pretend this token is the model's EOS
    got = run_to_completion(engine, {"a": (prompt, greedy)})["a"]
    assert got["token_ids"] == ref["token_ids"][: first + 1] and got["finish_reason"] == "stop"
    before = llama.tokenizer.decode(ref["token_ids"][:first])
    assert got["text"] == before


def test_cancel_frees_blocks_at_once_and_others_finish(llama) -> None:
    engine = make_engine(llama, max_num_seqs=4, block_size=8)
    for i, p in enumerate(random_prompts([40, 30, 20], seed=9)):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    for _ in range(4):
        engine.step()
    used = engine.pool.num_used_blocks
    own = len(engine.scheduler.get("r1").block_table)
    assert engine.abort("r1") and engine.pool.num_used_blocks == used - own
    assert not engine.abort("r1")
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id != "r1"
            if out.finished:
                finished[out.request_id] = out.num_output_tokens
    assert finished == {"r0": 30, "r2": 30} and engine.pool.num_used_blocks == 0


def test_infeasible_requests_are_refused_with_what_to_change(llama) -> None:
    engine = make_engine(llama, block_size=16, num_kv_blocks=4)
    assert engine.max_model_len == 64  # the model's 1024, capped by what the pool holds for one sequence
    assert engine.check_feasible(10, 10) is None
    assert "context of 64 tokens" in engine.check_feasible(60, 10)
    assert "context of 64 tokens" in engine.check_feasible(1000, 100)
    with pytest.raises(ValueError, match="lower max_tokens"):
        engine.add_request("x", [1] * 60, SamplingParams(max_tokens=10))
    assert not engine.has_unfinished()


def test_stats_and_step_records(llama) -> None:
    engine = make_engine(llama, max_num_seqs=2, block_size=8)
    records = []
    engine.add_step_listener(records.append)
    run_to_completion(engine, {f"r{i}": (p, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
                               for i, p in enumerate(random_prompts([9, 10, 11], seed=10))})
    assert records and all(0 < r.forward_s <= r.duration_s for r in records)
    assert max(r.num_running for r in records) == 2 and records[0].num_waiting == 1
    assert sum(r.num_prefill_tokens for r in records) == 30
    s = engine.stats()
    assert (s.num_waiting, s.num_running, s.num_slots, s.kv_blocks_used) == (0, 0, 2, 0)
    assert s.kv_blocks_total == engine.pool.num_blocks and s.last_step_duration_s > 0
    assert set(s.deferrals) == {"no_slot", "no_blocks"}
