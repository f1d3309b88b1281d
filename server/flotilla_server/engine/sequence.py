"""A request's state inside the engine: its tokens, its place in the KV pool, its lifecycle.

`Sequence` holds state only; the scheduler decides, the pool allocates, the model runner computes.
One request is one sequence per choice: `n` choices of each of its prompts share its `request_id` and
differ by `index` (prompt number x n + j). Choice j > 0 of a prompt waits in its leader's `forks` until
the leader's prefill samples, then forks from it (scheduler.py, "n").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.speculative import Backoff


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not holding a slot (new, or preempted)
    RUNNING = "running"  # holds a slot; its KV lives in block_table
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    ticket: int  # arrival order; a preempted sequence keeps it
    output_token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the pool
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None  # "stop", "length", "abort"
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks (block_hash.py)
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at its (last) admission
    index: int = 0  # choice index within its request
    forks: list[Sequence] = field(default_factory=list)  # choices that fork from this one's first sample
    fork_of: Sequence | None = None  # set while this choice waits in its leader's `forks`
    # its grammar's state (an llguidance LLMatcher, engine/grammar_book.py) when params.grammar is set: its own
    # per choice, advanced by each sampled token, kept across preemption
    matcher: Any = None
    backoff: Backoff = field(default_factory=Backoff)  # its proposals' acceptance (engine/speculative.py)

    @property
    def key(self) -> tuple[str, int]:
        """Unique per sequence: a request's choices share its request_id."""
        return self.request_id, self.index

    @property
    def num_seqs(self) -> int:
        """Slots this sequence holds: itself and the choices waiting to fork from it."""
        return 1 + len(self.forks)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        # 1 for a decode (the last sampled token); more for a prefill or a recompute
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def token_slice(self, start: int, stop: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        if start >= n:
            return self.output_token_ids[start - n : stop - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - n]


def new_request(request_id: str, prompts: list[list[int]], params: SamplingParams) -> list[Sequence]:
    """A request's sequences: one leader per prompt, each carrying its n - 1 forks; choice index = prompt
    number x n + j, as OpenAI numbers the choices of a list of prompts."""
    n = params.n
    leaders = []
    for p, prompt in enumerate(prompts):
        leader = Sequence(request_id, prompt, params, ticket=-1, index=p * n)
        leader.forks = [Sequence(request_id, prompt, params, ticket=-1, index=p * n + j) for j in range(1, n)]
        leaders.append(leader)
    return leaders
