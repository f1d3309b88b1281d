"""Draft verification (engine/speculative_verify.py): greedy acceptance, and rejection sampling that keeps the
target distribution (Monte Carlo with fixed seeds: the counts are the same on every run)."""

from __future__ import annotations

import pytest
import torch
from flotilla_server.engine.sampling import make_generator, sampling_probs
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.speculative_verify import residual_sample, verify

GREEDY = SamplingParams(temperature=0.0)
HISTORY = ([1, 2], [3])


def one_hot_rows(argmaxes: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), vocab)
    for i, a in enumerate(argmaxes):
        logits[i, a] = 5.0
    return logits


@pytest.mark.parametrize(("argmaxes", "draft", "expected"), [
    ([4, 2, 1], [4, 2], (2, 1)),  # all accepted: the last row gives the bonus token
    ([4, 2, 1], [4, 3], (1, 2)),  # the second differs: the model's token replaces it
    ([4, 2, 1], [0, 2], (0, 4)),  # the first differs: one token, as without a draft
    ([5], [], (0, 5)),
])
def test_greedy(argmaxes, draft, expected) -> None:
    assert verify(one_hot_rows(argmaxes), draft, GREEDY, HISTORY, None) == expected


def test_greedy_applies_penalties_over_the_history_with_the_draft_before_each_row() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9], [0.0, 3.0, 2.9]])
    params = SamplingParams(temperature=0.0, frequency_penalty=1.0)
    # row 0 sees output [3]: token 1 wins; row 1 sees [3, 1]: token 1 is penalized, token 2 wins
    assert verify(logits, [1], params, ([0], [0]), None) == (1, 2)


def committed(logits: torch.Tensor, draft: list[int], params: SamplingParams, n: int, seed: int) -> list[list[int]]:
    g = make_generator(seed)
    out = []
    for _ in range(n):
        m, token = verify(logits, draft, params, HISTORY, g)
        out.append([*draft[:m], token])
    return out


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3),
                                    SamplingParams(temperature=1.0, top_p=0.8)])
def test_sampling_keeps_the_target_distribution(params) -> None:
    logits = torch.tensor([[1.0, 0.2, 1.5, -0.5, 0.3], [0.4, 1.2, -1.0, 0.9, 0.0], [0.0, 0.1, 0.2, 0.3, 0.4]])
    draft = [2, 0]  # the first is likely (accepted about half the time), the second is not
    p = sampling_probs(logits, [params] * 3)
    n = 5000
    samples = committed(logits, draft, params, n, seed=11)
    first = torch.bincount(torch.tensor([s[0] for s in samples]), minlength=5).float() / n
    assert (first - p[0]).abs().max() < 0.03, (first, p[0])
    # given the first draft token accepted, the second committed token is distributed as row 1's p
    seconds = [s[1] for s in samples if s[0] == draft[0] and len(s) > 1]
    second = torch.bincount(torch.tensor(seconds), minlength=5).float() / len(seconds)
    assert len(seconds) > n * p[0, draft[0]] * 0.9
    assert (second - p[1]).abs().max() < 0.045, (second, p[1])


def test_a_seeded_request_verifies_the_same_way_every_run() -> None:
    logits = torch.randn(4, 7, generator=make_generator(3))
    params = SamplingParams(temperature=1.0, seed=5)
    assert committed(logits, [1, 2, 3], params, 50, seed=5) == committed(logits, [1, 2, 3], params, 50, seed=5)


def test_the_residual_never_draws_the_rejected_token() -> None:
    probs = torch.tensor([0.97, 0.01, 0.01, 0.01])
    g = make_generator(0)
    assert all(residual_sample(probs, 0, g) != 0 for _ in range(200))
