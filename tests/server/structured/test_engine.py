"""Constrained decoding inside the engine (the tiny model, in-process): each choice its own grammar state, a
preempted sequence resumes with its state intact, unconstrained rows beside constrained ones are unchanged,
and the mask applied to the logits is exactly the grammar's."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.grammar_mask import MaskFiller
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.grammar.json_schema import schema_grammar
from hypothesis import given, settings
from hypothesis import strategies as st

# a finite language: every reply ends within ~20 tokens, even from tiny's random weights
SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "fox"]},
                                           "legs": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["kind", "legs"], "additionalProperties": False}
GRAMMAR = schema_grammar(SCHEMA, "schema")


def engine(**config) -> EngineCore:
    return EngineCore(EngineConfig(model="tiny", **{"max_num_seqs": 8, "block_size": 8, **config}))


def run(core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[tuple[str, int], tuple]:
    for rid, (prompt, params) in requests.items():
        core.add_request(rid, prompt, params)
    texts: dict[tuple[str, int], str] = {}
    tokens: dict[tuple[str, int], list[int]] = {}
    finish: dict[tuple[str, int], str] = {}
    while core.has_unfinished():
        for o in core.step():
            key = (o.request_id, o.index)
            texts[key] = texts.get(key, "") + o.text
            tokens.setdefault(key, []).extend(o.token_ids)
            if o.finished:
                finish[key] = o.finish_reason
    return {k: (texts[k], tokens[k], finish[k]) for k in texts}


def prompts(n: int, length: int) -> list[list[int]]:
    return [[(7 * i + 13 * j) % 300 + 3 for j in range(length)] for i in range(n)]


def constrained(max_tokens: int = 40, **extra) -> SamplingParams:
    return SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, "grammar": GRAMMAR, **extra})


def test_every_choice_follows_its_own_grammar_state_and_ends_with_stop() -> None:
    core = engine()
    out = run(core, {"a": (prompts(1, 20)[0], constrained(n=3, temperature=1.0, seed=3)),
                     "b": (prompts(2, 9)[1], constrained())})
    assert core.grammars.builds == 1  # one grammar, built once, copied per sequence
    out = {k: v for k, v in out.items() if k[0] == "a"}
    assert len(out) == 3
    for text, _, reason in out.values():
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_preempted_sequence_resumes_with_its_grammar_state_intact() -> None:
    requests = {f"r{i}": (p, constrained()) for i, p in enumerate(prompts(6, 40))}
    roomy = run(engine(), requests)
    tight = engine(num_kv_blocks=24, max_num_batched_tokens=128, prefill_chunk=64)  # 6 x 8 blocks do not fit in 24
    squeezed = run(tight, requests)
    assert tight.scheduler.preemptions > 0
    assert squeezed == roomy
    for text, _, reason in roomy.values():
        assert reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)


def test_unconstrained_rows_beside_constrained_ones_are_unchanged() -> None:
    free = {f"free{i}": (p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(prompts(3, 15))}
    alone = run(engine(), free)
    mixed = run(engine(), {**free, **{f"c{i}": (p, constrained()) for i, p in enumerate(prompts(4, 9))}})
    assert {k: v for k, v in mixed.items() if k[0].startswith("free")} == alone


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(1, 200), seed=st.integers(0, 2**31 - 1))
def test_the_mask_refuses_exactly_the_tokens_whose_bit_is_clear(rows: int, vocab: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    filler = MaskFiller(vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, filler.words), dtype=torch.int32, generator=g)
    logits = torch.randn(rows + 2, vocab, generator=g)
    rows_t = torch.randperm(rows + 2, generator=g)[:rows]
    expected = logits.clone()
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    allowed = bits.view(rows, -1)[:, :vocab] == 1
    expected[rows_t] = expected[rows_t].masked_fill(~allowed, float("-inf"))
    filler.apply(logits, rows_t, bitmask)
    assert torch.equal(logits, expected)
    filler.close()


@pytest.mark.parametrize("n", [1, 2])
def test_the_filled_mask_is_the_grammars_own(n: int) -> None:
    core = engine()
    core.add_request("x", prompts(1, 5)[0], constrained(n=n))
    book = core.grammars
    book.wait(GRAMMAR)
    matcher = book.new_matcher(GRAMMAR)
    filler = MaskFiller(core.runner.grammar_vocab_size)
    bitmask, _ = filler.start([book.new_matcher(GRAMMAR) for _ in range(n)]).result()
    reference = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
    assert all(torch.equal(bitmask[i], reference[: filler.words]) for i in range(n))
    filler.close()
    core.close()
