"""StepPlan: what one engine step computes, as the scheduler decides it and the model runner carries it out.

A plan is read-only once made: the runner turns it into tensors, and `Scheduler.update` applies the tokens
sampled for its rows, in the order of `sampled_seqs()`. A decode row may carry a draft (engine/speculative.py):
its chunk then feeds the last sampled token and the draft, and every one of its positions is verified.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flotilla_server.engine.sequence import Sequence


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    start: int  # first position fed this step (the sequence's computed tokens before the step)
    num_tokens: int  # query length this step
    sample: bool  # the chunk reaches the sequence's last token, so a new token is sampled
    forks: tuple[Sequence, ...] = ()  # with sample: choices that take a token of their own from this row
    draft_token_ids: tuple[int, ...] = ()  # a decode's proposed tokens, fed after its last token (num_tokens - 1)

    @property
    def context_len(self) -> int:  # KV positions after this step's writes
        return self.start + self.num_tokens


@dataclass
class StepPlan:
    # prefill chunks first, then decodes with a draft, then plain decodes (the attention's trailing one-token run)
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    num_draft_tokens: int = 0  # proposed tokens fed after decode rows

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs + self.num_draft_tokens

    def drafted(self) -> list[ScheduledChunk]:
        """The chunks carrying a draft, in plan order (the order of StepResult.num_accepted)."""
        return [c for c in self.chunks if c.draft_token_ids]

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    def sampled_seqs(self) -> list[Sequence]:
        """One per sampled row, in the order of the sampled tokens: each sampling chunk's sequence, then its forks."""
        return [s for c in self.chunks if c.sample for s in (c.seq, *c.forks)]
