"""Token sampling for a whole step at once: penalties, greedy, temperature, top-k, top-p, min-p, per-request seeds.

Random rows sample by the exponential race (argmax of p / E with E ~ Exp(1)), which equals drawing
from p. Each seeded request draws its noise from its own generator, so its tokens do not depend on
which other requests shared the batch; unseeded rows share the engine's generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flotilla_server.engine.penalties import TokenHistory, apply_penalties
from flotilla_server.engine.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    default_generator: torch.Generator | None = None,
    histories: Sequence[TokenHistory] | None = None,
) -> list[int]:
    """logits: [N, vocab] float32, row i for a request with `params[i]`. Returns N token ids.

    `histories` (each row's prompt and output token ids) is needed only when a row has penalties."""
    if any(p.has_penalties for p in params):
        if histories is None:
            raise ValueError("penalties need each row's token history")
        logits = apply_penalties(logits, params, histories)
    if all(p.greedy for p in params):
        return logits.argmax(dim=-1).tolist()
    greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    probs = sampling_probs(logits, params)
    noise = torch.empty_like(probs).exponential_(generator=default_generator)
    for i, g in enumerate(generators):
        if g is not None and not params[i].greedy:
            noise[i].exponential_(generator=g)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled).tolist()


def sampling_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """[N, vocab]: the distribution each row is drawn from, after temperature, top-k, top-p and min-p (penalties
    already applied); a greedy row's is its softmax at temperature 1, never drawn from. Speculative verification
    (engine/speculative_verify.py) accepts and resamples against the same distribution."""
    device = logits.device
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=device)
    logits = logits / temps.unsqueeze(1)
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        logits = _top_k_top_p(logits, params)
    probs = torch.softmax(logits, dim=-1)
    if any(p.min_p > 0.0 for p in params):  # vLLM's min-p, on the probabilities after temperature
        min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype, device=device).unsqueeze(1)
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs


def _top_k_top_p(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    vocab = logits.shape[-1]
    device = logits.device
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    drop = ranks >= top_k.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = mass_before > top_p.unsqueeze(1)  # keeps the smallest prefix whose mass reaches top_p; never the first
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
