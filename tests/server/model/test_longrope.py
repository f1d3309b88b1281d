"""Phi-3's LongRoPE from a Hugging Face directory, with a small original length (64) so that tests cross it.

The runtime's rule (model/rope.py): a token at position p rotates by the short factors while p < 64, by the long
ones from there on. For sequences of at most 64 tokens, prompt and output, that is transformers' rotation (all
short). Past 64 the reference is transformers fed position by position (one pass up to 64, then one token per
pass): it picks one set of factors per pass, by the pass's largest position, so its choice per pass is then the
choice per position. Its own one-pass prefill (and `generate`, which recomputes a sequence that passes 64)
rotates every token by the long factors instead, as rope.py says.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flotilla_server.model import load_model
from flotilla_server.model.config import ModelConfig
from flotilla_server.model.rope import inverse_frequencies, longrope_cos_sin

from tests.support.hf_models import hf_greedy, make_hf_model_dir, random_prompts

from .paged import paged_greedy

NEW_TOKENS = 12
# Phi-4-mini's shape, small: 3/4 of each head of 16 rotated (12 dims, 6 frequencies), LongRoPE from 64 positions
ORIGINAL = 64
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
            "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]}
PHI4_MINI_LIKE = {"partial_rotary_factor": 0.75, "max_position_embeddings": 2048,
                  "original_max_position_embeddings": ORIGINAL, "rope_parameters": LONGROPE}


@pytest.fixture(scope="module")
def phi4_mini_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_model_dir("phi3", tmp_path_factory.mktemp("longrope"), **PHI4_MINI_LIKE)


def test_frequencies_attention_factor_and_cos_sin_are_transformers_bits() -> None:
    import transformers
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    hf = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, **PHI4_MINI_LIKE)
    config = ModelConfig.from_hf({**hf.to_dict(), "vocab_size": 384})
    scaling = config.rope_scaling
    short = inverse_frequencies(config.rotary_dim, config.rope_theta, scaling)
    long = inverse_frequencies(config.rotary_dim, config.rope_theta, scaling, long=True)
    rope = Phi3RotaryEmbedding(hf)
    assert torch.equal(short, rope.original_inv_freq) and rope.attention_scaling == scaling.attention_factor
    positions = torch.arange(ORIGINAL + 20)
    cos, sin = longrope_cos_sin(positions, short, long, scaling, torch.float32)
    x = torch.zeros(1, 1, 1)
    for p in positions.tolist():  # one position per pass: transformers' per-pass choice is then per position
        hf_cos, hf_sin = rope(x, torch.tensor([[p]]))
        assert torch.equal(cos[p], hf_cos[0, 0]) and torch.equal(sin[p], hf_sin[0, 0]), p
    assert not torch.equal(cos[ORIGINAL - 1], longrope_cos_sin(positions[ORIGINAL - 1:ORIGINAL], long, long, scaling,
                                                               torch.float32)[0][0])


def test_sequences_within_the_original_length_equal_transformers(phi4_mini_like: Path) -> None:
    """Prompts of 40, 9 and 53 tokens, 12 new tokens each: the last sequence runs up to position 63, the last
    one of the short factors (its 12th token is sampled there)."""
    prompts = random_prompts([40, 9, 53], seed=21)
    expected = hf_greedy(phi4_mini_like, prompts, NEW_TOKENS)
    model = load_model(str(phi4_mini_like), "float32", "cpu").model
    assert paged_greedy(model, prompts, NEW_TOKENS, chunk=16, start_steps=[0, 1, 2], block_size=8) == expected


def hf_greedy_position_by_position(model, prompt: list[int], new_tokens: int, first: int) -> tuple[list[int], torch.Tensor]:
    """transformers with its KV cache: the first `first` tokens in one pass, then one token per pass; returns the
    greedy tokens and the logits after the prompt."""
    with torch.no_grad():
        out = model(torch.tensor([prompt[:first]]), use_cache=True)
        for token in prompt[first:]:
            out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        prompt_logits, tokens = out.logits[0, -1], []
        for _ in range(new_tokens):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, prompt_logits


def test_past_the_original_length_each_position_takes_its_own_factors(phi4_mini_like: Path) -> None:
    """A 100-token prompt in chunks of 48 (one straddles position 64), and a 70-token one alone."""
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(phi4_mini_like, dtype=torch.float32).eval()
    prompts = random_prompts([100, 70], seed=22)
    expected, logits = zip(*(hf_greedy_position_by_position(reference, p, NEW_TOKENS, ORIGINAL) for p in prompts),
                           strict=True)
    model = load_model(str(phi4_mini_like), "float32", "cpu").model
    assert paged_greedy(model, prompts, NEW_TOKENS, chunk=48, start_steps=[0, 2], block_size=8) == list(expected)
    assert len(set(expected[0])) > 1, "degenerate reference: the comparison would be weak"
    with torch.no_grad():  # transformers' one-pass prefill rotates all 100 by the long factors: not this rule
        one_pass = reference(torch.tensor([prompts[0]])).logits[0, -1]
    assert not torch.allclose(one_pass, logits[0], atol=1e-3)
