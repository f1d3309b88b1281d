"""Log-probabilities of the sampled tokens, for the requests that ask (`logprobs` / `top_logprobs`).

They are the raw log-probabilities of the model: log_softmax of the logits before penalties, temperature,
top-k, top-p and min-p, as vLLM returns by default (its `logprobs_mode="raw_logprobs"`). So a token's
logprob does not depend on the sampling settings that chose it, and greedy logprobs equal
`transformers`' log_softmax of the same logits. Computed for the asking rows only, in one batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flotilla_server.engine.outputs import TokenLogprobs


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int],
                   wanted: Sequence[int | None]) -> list[TokenLogprobs | None]:
    """logits: [N, vocab], the raw logits of N sampled rows; tokens: the N sampled ids; wanted[i]: how many
    likeliest tokens row i asks for (0 to 20), or None for no logprobs."""
    rows = [i for i, k in enumerate(wanted) if k is not None]
    out: list[TokenLogprobs | None] = [None] * len(wanted)
    if not rows:
        return out
    device = logits.device
    lp = torch.log_softmax(logits.index_select(0, torch.tensor(rows, device=device)).float(), dim=-1)
    chosen = torch.tensor([tokens[i] for i in rows], device=device).unsqueeze(1)
    chosen_lp = lp.gather(1, chosen).squeeze(1).tolist()
    k = min(max(wanted[i] or 0 for i in rows), lp.shape[-1])
    top_lp, top_ids = lp.topk(k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())  # sorted, likeliest first
    top_lp_rows, top_id_rows = top_lp.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        n = wanted[i] or 0
        out[i] = TokenLogprobs(chosen_lp[j], list(zip(top_id_rows[j][:n], top_lp_rows[j][:n], strict=True)))
    return out
