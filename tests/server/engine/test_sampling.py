"""Batched sampling: greedy, temperature, top-k, top-p, and per-request seeds."""

from __future__ import annotations

import math

import torch
from flotilla_server.engine.sampling import make_generator, sample
from flotilla_server.engine.sampling_params import SamplingParams


def test_greedy_is_argmax_row_by_row() -> None:
    logits = torch.randn(8, 50, generator=make_generator(0))
    assert sample(logits, [SamplingParams(temperature=0.0)] * 8, [None] * 8) == logits.argmax(-1).tolist()


def test_greedy_rows_stay_greedy_in_a_mixed_batch() -> None:
    logits = torch.randn(6, 50, generator=make_generator(1))
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.5) for i in range(6)]
    got = sample(logits, params, [None] * 6, make_generator(2))
    assert [got[i] for i in (1, 3, 5)] == logits.argmax(-1)[[1, 3, 5]].tolist()


def test_seeded_rows_do_not_depend_on_their_neighbours() -> None:
    logits = torch.randn(5, 100, generator=make_generator(3))
    p = SamplingParams(temperature=1.0, seed=42)
    alone = [sample(logits[2:3], [p], [make_generator(42)])[0] for _ in range(3)]
    gens = [None, make_generator(7), make_generator(42), None, None]
    params = [SamplingParams(temperature=0.7), SamplingParams(seed=7), p, SamplingParams(), SamplingParams(top_k=3)]
    mixed = sample(logits, params, gens, make_generator(9))
    assert alone == [alone[0]] * 3 and mixed[2] == alone[0]
    g = make_generator(42)
    seq_alone = [sample(logits[2:3], [p], [g])[0] for _ in range(20)]
    g2 = make_generator(42)
    seq_mixed = [sample(logits, params, [None, None, g2, None, None], make_generator(i))[2] for i in range(20)]
    assert seq_alone == seq_mixed and len(set(seq_alone)) > 1


def test_temperature_one_follows_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.2])
    n = 6000
    logits = probs.log().expand(n, 3).clone()
    got = torch.tensor(sample(logits, [SamplingParams(temperature=1.0)] * n, [None] * n, make_generator(5)))
    freq = torch.bincount(got, minlength=3).float() / n
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_top_k_and_top_p_cut_the_support() -> None:
    n = 2000
    logits = torch.tensor([3.0, 2.9, 2.8, 0.0, -1.0]).expand(n, 5).clone()
    top2 = set(sample(logits, [SamplingParams(top_k=2)] * n, [None] * n, make_generator(6)))
    assert top2 == {0, 1}
    # probabilities ~[0.33, 0.30, 0.27, 0.02, 0.01]: top_p 0.5 keeps the first two
    nucleus = set(sample(logits, [SamplingParams(top_p=0.5)] * n, [None] * n, make_generator(7)))
    assert nucleus == {0, 1}
    tiny_p = set(sample(logits, [SamplingParams(top_p=0.01)] * n, [None] * n, make_generator(8)))
    assert tiny_p == {0}
    hot = sample(logits, [SamplingParams(temperature=100.0)] * n, [None] * n, make_generator(9))
    assert set(hot) == {0, 1, 2, 3, 4}  # a high temperature flattens the distribution
    assert not math.isnan(sum(hot))


def _row(*values: float) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float32)


def test_frequency_penalty_subtracts_per_occurrence_and_presence_penalty_once() -> None:
    from flotilla_server.engine.penalties import apply_penalties

    logits = _row(1.0, 1.0, 1.0, 1.0)
    history = [([3], [0, 0, 0, 1])]  # token 0 three times and token 1 once in the output; 3 only in the prompt
    got = apply_penalties(logits, [SamplingParams(frequency_penalty=0.5)], history)
    assert got.tolist() == [[1.0 - 1.5, 1.0 - 0.5, 1.0, 1.0]]
    got = apply_penalties(logits, [SamplingParams(presence_penalty=0.5)], history)
    assert got.tolist() == [[0.5, 0.5, 1.0, 1.0]]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    from flotilla_server.engine.penalties import apply_penalties

    logits = _row(2.0, -2.0, 2.0, -2.0)
    got = apply_penalties(logits, [SamplingParams(repetition_penalty=2.0)], [([0], [1])])
    assert got.tolist() == [[1.0, -4.0, 2.0, -2.0]]  # 0 (prompt) and 1 (output) penalized; 2 and 3 unseen


def test_penalties_change_a_greedy_choice_as_defined_and_at_zero_change_nothing() -> None:
    logits = _row(3.0, 2.5, 0.0)
    history = [([], [0, 0])]  # the likeliest token already came twice
    assert sample(logits, [SamplingParams(temperature=0.0)], [None], None, history) == [0]
    zero = SamplingParams(temperature=0.0, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0)
    assert sample(logits, [zero], [None], None, history) == [0]
    assert sample(logits, [SamplingParams(temperature=0.0, frequency_penalty=0.3)], [None], None, history) == [1]
    assert sample(logits, [SamplingParams(temperature=0.0, presence_penalty=0.6)], [None], None, history) == [1]
    assert sample(logits, [SamplingParams(temperature=0.0, repetition_penalty=1.3)], [None], None, history) == [1]


def test_min_p_never_samples_a_token_below_min_p_times_the_likeliest() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log().repeat(400, 1)
    params = [SamplingParams(temperature=1.0, min_p=0.4)] * 400  # keeps p >= 0.2: tokens 0 and 1
    got = sample(logits, params, [None] * 400, make_generator(5))
    assert set(got) == {0, 1}
    free = sample(logits, [SamplingParams(temperature=1.0)] * 400, [None] * 400, make_generator(5))
    assert {2, 3} & set(free)  # without min_p the unlikely tokens do come


def test_a_tiny_temperature_is_greedy_not_nan() -> None:
    logits = torch.randn(4, 50, generator=make_generator(21))
    for temperature in (1e-40, 1e-6):
        params = [SamplingParams(temperature=temperature)] * 4
        assert all(p.greedy for p in params)
        assert sample(logits, params, [None] * 4, make_generator(1)) == logits.argmax(-1).tolist()
    assert not SamplingParams(temperature=1e-4).greedy
