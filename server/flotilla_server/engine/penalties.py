"""Repetition penalties on a whole step's logits at once, on the device, with OpenAI's and vLLM's meanings.

Applied to the raw logits before temperature, top-k, top-p and min-p, as vLLM does, and to greedy rows too:

- frequency_penalty (OpenAI): logit -= frequency_penalty x (times the token appears in the output so far);
- presence_penalty (OpenAI): logit -= presence_penalty if the token appears in the output so far;
- repetition_penalty (vLLM, the CTRL paper's): for a token in the prompt or the output, a positive logit is
  divided by it and a negative one multiplied by it (1 changes nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flotilla_server.engine.sampling_params import SamplingParams

TokenHistory = tuple[Sequence[int], Sequence[int]]  # (prompt token ids, output token ids) of one row


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams],
                    histories: Sequence[TokenHistory]) -> torch.Tensor:
    """logits: [N, vocab]; returns new logits with each row's penalties applied (rows without any unchanged)."""
    n, vocab = logits.shape
    device = logits.device
    output_counts = _counts([h[1] for h in histories], n, vocab, device)
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=logits.dtype, device=device).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], dtype=logits.dtype, device=device).unsqueeze(1)
    logits = logits - freq * output_counts - pres * (output_counts > 0).to(logits.dtype)
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = (output_counts > 0) | (_counts([h[0] for h in histories], n, vocab, device) > 0)
        rep = torch.tensor([p.repetition_penalty for p in params], dtype=logits.dtype, device=device).unsqueeze(1)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    return logits


def _counts(rows: Sequence[Sequence[int]], n: int, vocab: int, device: torch.device) -> torch.Tensor:
    """[n, vocab] float32: how many times each token id appears in each row."""
    counts = torch.zeros(n, vocab, dtype=torch.float32, device=device)
    width = max((len(r) for r in rows), default=0)
    if width == 0:
        return counts
    ids = torch.full((n, width), vocab, dtype=torch.long)  # padding goes to an extra column, then dropped
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    padded = torch.zeros(n, vocab + 1, dtype=torch.float32, device=device)
    padded.scatter_add_(1, ids.to(device), torch.ones(n, width, dtype=torch.float32, device=device))
    return padded[:, :vocab]
