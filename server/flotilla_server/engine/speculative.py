"""Speculative decoding by prompt lookup (n-gram): what a decoding sequence proposes, and how much.

Policy only, no tensors. A decoding sequence whose last few tokens appeared earlier in its own prompt or output
proposes the tokens that followed them there; the model runner verifies the proposal in the step's one forward
pass (engine/speculative_verify.py) and the scheduler commits what was accepted (docs/architecture.md,
"Speculative decoding").

A proposal is not free: on a CPU each row of a step costs about a quarter of a one-row decode step more (SmolLM2-135M
on the 2-core Xeon: 4 rows 1.5x one row, 9 rows 2.8-3x), so a proposal pays only if enough of it is accepted. Each
sequence estimates its per-token acceptance a (accepted tokens over accepted tokens plus rejections, both decayed),
and proposes the length L that maximises the expected tokens per unit of step time, (1 + a + ... + a^L) /
(1 + ROW_COST x L). When no length gains MIN_GAIN, it pauses: no proposals for 8 decode steps, then 16, 32, ... up
to 256 while they keep failing, each pause ending with a one-token probe.

Rules:
- proposals come from the sequence's own tokens only; the longest n-gram match wins, then the most recent;
- a draft never makes the sequence pass max_tokens: the step commits at most len(draft) + 1 tokens;
- speculation is off for a request that opts out (`speculative: false`) or follows a grammar (its matcher would
  have to roll back rejected tokens: not built).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from flotilla_contract.flags import MAX_SPECULATIVE_TOKENS, MIN_SPECULATIVE_TOKENS

from flotilla_server.engine.sampling_params import SamplingParams

NGRAM_SIZES = (4, 3, 2)  # match lengths tried, longest first
# a proposed token's extra step time, in one-row decode steps (measured on CPU: the module's docstring); a GPU's
# rows cost less, so there the rule proposes less than would pay
ROW_COST = 0.25
MIN_GAIN = 1.05  # expected tokens per unit of step time a proposal must reach
PRIOR_ACCEPTED, PRIOR_REJECTED = 3.0, 1.0  # a new sequence's counts: a = 0.75, so its first drafts are short
PROBE_ACCEPTED, PROBE_REJECTED = 1.0, 1.0  # after a pause: a one-token probe, whose failure pauses again
DECAY = 0.8  # weight of the older counts at each verification
FIRST_PAUSE_STEPS, MAX_PAUSE_STEPS = 8, 256  # a pause's length in decode steps; doubles while proposals fail


def propose(tokens: Seq[int], k: int, sizes: Seq[int] = NGRAM_SIZES) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of `tokens`' last n tokens, for the first n of
    `sizes` that occurs; [] when none does. Pure: the table tests drive it directly."""
    end = len(tokens)
    for n in sizes:
        if end <= n:
            continue
        pattern = list(tokens[end - n:])
        first = pattern[0]
        for i in range(end - n - 1, -1, -1):  # the latest occurrence first; never the suffix itself
            if tokens[i] == first and list(tokens[i:i + n]) == pattern:
                return list(tokens[i + n:i + n + k])
    return []


def expected_gain(a: float, length: int) -> float:
    """Expected tokens a step commits with a draft of `length` (1 + a + ... + a^length, tokens accepted in a row
    with probability a each), per unit of its time (1 + ROW_COST x length)."""
    return sum(a**i for i in range(length + 1)) / (1 + ROW_COST * length)


def best_length(a: float, k: int) -> int:
    """The draft length up to k with the best expected gain; 0 when none reaches MIN_GAIN."""
    length = max(range(1, k + 1), key=lambda n: expected_gain(a, n))
    return length if expected_gain(a, length) >= MIN_GAIN else 0


@dataclass
class Backoff:
    """One sequence's acceptance record (held on its Sequence)."""

    accepted: float = PRIOR_ACCEPTED  # draft tokens accepted, decayed
    rejected: float = PRIOR_REJECTED  # verifications that rejected a token, decayed
    pause_steps: int = 0  # decode steps left without proposals
    next_pause_steps: int = FIRST_PAUSE_STEPS

    @property
    def rate(self) -> float:
        """The estimated chance that a proposed token is accepted, given those before it were."""
        return self.accepted / (self.accepted + self.rejected)

    def draft_limit(self, k: int) -> int:
        """How many tokens the sequence may propose this step: 0 while it pauses (the step is counted), else at
        least 1 (a sequence that proposes is judged by what follows)."""
        if self.pause_steps > 0:
            self.pause_steps -= 1
            return 0
        return max(1, best_length(self.rate, k))

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        self.accepted = DECAY * self.accepted + num_accepted
        self.rejected = DECAY * self.rejected + (num_accepted < num_proposed)
        if best_length(self.rate, MAX_SPECULATIVE_TOKENS) > 0:
            self.next_pause_steps = FIRST_PAUSE_STEPS
            return
        self.pause_steps = self.next_pause_steps
        self.next_pause_steps = min(MAX_PAUSE_STEPS, 2 * self.next_pause_steps)
        self.accepted, self.rejected = PROBE_ACCEPTED, PROBE_REJECTED


def wants_speculation(params: SamplingParams) -> bool:
    """The request may propose: it did not opt out and follows no grammar."""
    return params.speculative and params.grammar is None


@dataclass
class Speculator:
    """The engine's n-gram proposer with its counters (the scheduler holds one when speculation is on)."""

    k: int
    num_drafts: int = 0  # verifications, since start
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0

    def __post_init__(self) -> None:
        if not MIN_SPECULATIVE_TOKENS <= self.k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_tokens must be in {MIN_SPECULATIVE_TOKENS}..{MAX_SPECULATIVE_TOKENS}, "
                             f"got {self.k}")

    def draft_limit(self, backoff: Backoff, params: SamplingParams, num_output_tokens: int, budget_tokens: int) -> int:
        """How many tokens a decoding sequence may propose this step: at most k, at most `budget_tokens` (what the
        step has left), never past max_tokens (the step commits the draft and one token more), and what its
        acceptance makes worth it; 0: it proposes nothing (its tokens are not even searched)."""
        limit = min(self.k, budget_tokens, params.max_tokens - num_output_tokens - 1)
        if limit < 1 or not wants_speculation(params):
            return 0
        return min(limit, backoff.draft_limit(self.k))

    def stats(self) -> dict:
        """EngineStats' speculation fields."""
        return {"speculating": True, "spec_drafts": self.num_drafts, "spec_proposed_tokens": self.num_proposed_tokens,
                "spec_accepted_tokens": self.num_accepted_tokens}

    def observe(self, backoff: Backoff, num_proposed: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_proposed_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        backoff.observe(num_proposed, num_accepted)
