"""Greedy output of the paged runtime equals transformers `generate`, token for token, in float32."""

from __future__ import annotations

import random

import pytest
from flotilla_server.model import load_model

from tests.support.hf_models import hf_greedy, random_prompts

from .conftest import DEVICE, VARIANTS
from .paged import paged_greedy

NEW_TOKENS = 8


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_single_sequence(hf_model_dir, variant):
    path = hf_model_dir(variant)
    prompts = random_prompts([23], seed=1)
    expected = hf_greedy(path, prompts, 16, DEVICE)
    model = load_model(str(path), "float32", DEVICE).model
    assert paged_greedy(model, prompts, 16) == expected
    assert len(set(expected[0])) > 1, "degenerate reference: the comparison would be weak"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mixed_batch_of_prefill_chunks_and_decodes(hf_model_dir, variant):
    """16 sequences, prompts 5..300 tokens, joining at different steps, prefill in chunks of 64:
    most steps hold prefill chunks of some sequences and decode rows of others."""
    path = hf_model_dir(variant)
    lengths = [5, 300, 17, 64, 65, 120, 8, 250, 33, 16, 1 + 15, 199, 47, 90, 6, 150]
    prompts = random_prompts(lengths, seed=2)
    starts = random.Random(3).choices(range(6), k=len(prompts))
    expected = hf_greedy(path, prompts, NEW_TOKENS, DEVICE)
    model = load_model(str(path), "float32", DEVICE).model
    got = paged_greedy(model, prompts, NEW_TOKENS, chunk=64, start_steps=starts, block_size=16)
    assert got == expected


@pytest.mark.parametrize("variant", ["llama-gqa", "qwen3-qknorm-sharded"])
@pytest.mark.parametrize("chunk", [7, 16])
def test_chunked_prefill_gives_the_same_tokens(hf_model_dir, variant, chunk):
    path = hf_model_dir(variant)
    prompts = random_prompts([50], seed=4)
    expected = hf_greedy(path, prompts, NEW_TOKENS, DEVICE)
    model = load_model(str(path), "float32", DEVICE).model
    assert paged_greedy(model, prompts, NEW_TOKENS, chunk=chunk, block_size=8) == expected


def test_llama3_rope_scaling(tmp_path):
    """original_max_position_embeddings=32 puts the prompt past the scaling knee."""
    from tests.support.hf_models import make_hf_model_dir

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}
    path = make_hf_model_dir("llama", tmp_path / "llama3", rope_scaling=rope, num_attention_heads=2,
                             num_key_value_heads=1, hidden_size=128)
    loaded = load_model(str(path), "float32", DEVICE)
    assert loaded.config.rope_scaling is not None and loaded.config.rope_scaling.rope_type == "llama3"
    assert loaded.config.rope_theta == 500000.0
    prompts = random_prompts([100, 9], seed=5)
    expected = hf_greedy(path, prompts, NEW_TOKENS, DEVICE)
    assert paged_greedy(loaded.model, prompts, NEW_TOKENS, chunk=40, start_steps=[0, 2]) == expected
