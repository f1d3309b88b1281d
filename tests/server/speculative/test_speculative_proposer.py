"""The n-gram proposer and the back-off (engine/speculative.py): pure decisions, driven by tables."""

from __future__ import annotations

import pytest
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.speculative import (
    FIRST_PAUSE_STEPS,
    MAX_PAUSE_STEPS,
    Backoff,
    Speculator,
    best_length,
    propose,
)


@pytest.mark.parametrize(("tokens", "k", "expected"), [
    ([], 4, []),  # nothing to match
    ([1, 2], 4, []),  # too short for any n-gram with something before it
    ([1, 2, 3, 4, 5], 4, []),  # no n-gram repeats
    ([1, 2, 3, 9, 1, 2], 4, [3, 9, 1, 2]),  # bigram [1, 2] seen at 0: what followed it, up to k
    ([1, 2, 3, 9, 1, 2], 2, [3, 9]),  # k cuts the proposal
    ([7, 1, 2, 5, 1, 2, 6, 8, 1, 2], 3, [6, 8, 1]),  # the latest earlier occurrence wins
    ([5, 1, 2, 3, 9, 1, 2, 3, 4, 0, 2, 3], 2, [4, 0]),  # bigram [2, 3]: latest at 6, followed by 4, 0
    ([1, 2, 3, 7, 0, 2, 3, 8, 1, 2, 3], 2, [7, 0]),  # trigram [1, 2, 3] beats the more recent bigram [2, 3]
    ([4, 4, 4, 4, 4], 3, [4]),  # overlapping match: only the tokens that exist follow it
    ([1, 2, 1, 2, 1, 2], 4, [1, 2]),  # 4-gram [1,2,1,2] at 0 is followed by [1, 2] (the suffix itself excluded)
    ([3, 1, 2], 4, []),  # a unigram match is not enough
])
def test_propose(tokens, k, expected) -> None:
    assert propose(tokens, k) == expected


@pytest.mark.parametrize(("a", "length"), [(0.2, 0), (0.3, 0), (0.5, 1), (0.75, 3), (0.9, 6), (0.98, 15)])
def test_the_draft_length_maximises_tokens_per_step_time(a, length) -> None:
    assert best_length(a, 16) == length
    assert best_length(a, 4) == min(length, 4)


def test_backoff_lengthens_drafts_that_are_accepted_and_pauses_ones_that_are_not() -> None:
    b = Backoff()
    assert b.draft_limit(16) == 3  # a new sequence starts short
    for _ in range(4):
        b.observe(b.draft_limit(16), b.draft_limit(16))
    assert b.draft_limit(16) >= 12  # every token accepted: the drafts grow
    pauses = []
    for _ in range(30):
        while (limit := b.draft_limit(16)) == 0:
            pass
        b.observe(limit, 0)
        pauses.append(b.pause_steps)
    first = next(i for i, p in enumerate(pauses) if p)
    assert pauses[first:first + 3] == [FIRST_PAUSE_STEPS, 2 * FIRST_PAUSE_STEPS, 4 * FIRST_PAUSE_STEPS]
    assert max(pauses) == MAX_PAUSE_STEPS
    for _ in range(b.pause_steps):
        assert b.draft_limit(16) == 0
    assert b.draft_limit(16) == 1  # after a pause, a one-token probe
    b.observe(1, 1)  # that is accepted: the next pause is short again
    assert b.pause_steps == 0 and b.next_pause_steps == FIRST_PAUSE_STEPS


@pytest.mark.parametrize(("params", "num_output", "budget", "expected"), [
    (SamplingParams(max_tokens=100), 0, 100, 3),  # a new sequence's acceptance allows 3
    (SamplingParams(max_tokens=100), 0, 2, 2),  # the step's budget left
    (SamplingParams(max_tokens=5), 3, 100, 1),  # 5 - 3 - 1: the step commits the draft and one more
    (SamplingParams(max_tokens=5), 4, 100, 0),  # the last token is never drafted
    (SamplingParams(max_tokens=100, speculative=False), 0, 100, 0),  # the request opted out
    (SamplingParams(max_tokens=100, grammar='start: "a"'), 0, 100, 0),  # constrained: off
])
def test_draft_limits(params, num_output, budget, expected) -> None:
    assert Speculator(k=4).draft_limit(Backoff(), params, num_output, budget) == expected


@pytest.mark.parametrize("k", [0, 17, -1])
def test_k_outside_1_to_16_is_refused(k) -> None:
    with pytest.raises(ValueError, match=r"speculative_tokens must be in 1\.\.16"):
        Speculator(k=k)
