"""Verification of a draft (engine/speculative.py) against the model's logits at each of its positions.

A drafted row's chunk feeds the sequence's last token and its k draft tokens, so its k + 1 logits rows are the
target model's next-token distributions after each prefix. Exactness is the point of the method:

- greedy: draft token j is accepted while it is the argmax at row j; the first row whose argmax differs, or row
  k when all are accepted, gives the next token. So the output equals greedy decoding without a draft;
- sampling: the standard speculative rejection rule (Leviathan et al. 2023, Chen et al. 2023) with the draft a
  point mass q = δ(x): accept x with probability min(1, p(x) / q(x)) = p(x); on rejection draw from the
  residual norm(max(0, p - q)), which is p with x's mass removed and renormalised; after k acceptances draw the
  bonus token from p. Each committed token is then distributed as p, as without speculation;
- p is the distribution `sample` draws from (engine/sampling.py: penalties over the history including the draft
  tokens before it, temperature, top-k, top-p, min-p); a seeded request draws from its own generator, so it is
  reproducible run to run (not token-equal to its run without speculation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flotilla_server.engine.penalties import TokenHistory, apply_penalties
from flotilla_server.engine.sampling import sampling_probs
from flotilla_server.engine.sampling_params import SamplingParams


def verify(logits: torch.Tensor, draft: Sequence[int], params: SamplingParams, history: TokenHistory,
           generator: torch.Generator | None) -> tuple[int, int]:
    """logits: [k + 1, vocab], row j after the draft's first j tokens; history: the sequence's (prompt, output)
    before the draft. Returns (draft tokens accepted, the token after them)."""
    k = len(draft)
    rows = [params] * (k + 1)
    if params.has_penalties:
        prompt, output = history
        logits = apply_penalties(logits, rows, [(prompt, [*output, *draft[:j]]) for j in range(k + 1)])
    if params.greedy:
        targets = logits.argmax(dim=-1).tolist()
        m = 0
        while m < k and targets[m] == draft[m]:
            m += 1
        return m, targets[m]
    probs = sampling_probs(logits, rows)
    draft_t = torch.tensor(list(draft), dtype=torch.long, device=logits.device)
    p_draft = probs[:k].gather(1, draft_t.unsqueeze(1)).squeeze(1)
    uniform = torch.rand(k, generator=generator, device=logits.device)  # one per draft token, drawn always
    accepted = (uniform < p_draft).tolist()
    m = accepted.index(False) if False in accepted else k
    return m, residual_sample(probs[m], draft[m] if m < k else None, generator)


def residual_sample(probs: torch.Tensor, rejected: int | None, generator: torch.Generator | None) -> int:
    """A draw from `probs` with the rejected token's mass removed (renormalised by the race itself)."""
    probs = probs.clone()
    if rejected is not None:
        probs[rejected] = 0.0
    noise = torch.empty_like(probs).exponential_(generator=generator)  # argmax of p / E is a draw from p
    return int((probs / noise).argmax())

