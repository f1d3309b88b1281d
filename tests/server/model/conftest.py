"""Fixtures: small random Hugging Face models (saved with save_pretrained) and their transformers twins.

FLOTILLA_TEST_DEVICE=cuda runs the equality and half-precision tests on a GPU (default: cpu).
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from tests.support.hf_models import make_hf_model_dir

DEVICE = os.environ.get("FLOTILLA_TEST_DEVICE", "cpu")

# name -> (arch, overrides): every architecture, with grouped-query attention, tied embeddings, sharding
VARIANTS = {
    "llama-gqa": ("llama", {}),
    "llama-tied-mha": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "mistral-gqa": ("mistral", {"num_key_value_heads": 1}),
    "qwen2-bias-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-qknorm-sharded": ("qwen3", {"max_shard_size": "100KB"}),
}


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """hf_model_dir(variant) -> Path, built once per session."""
    cache: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in cache:
            arch, overrides = VARIANTS[variant]
            cache[variant] = make_hf_model_dir(arch, tmp_path_factory.mktemp(variant), **overrides)
        return cache[variant]

    return get


def random_prompts(lengths: Sequence[int], seed: int = 0, vocab: int = 380) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def hf_greedy(
    path: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int, device: str = "cpu"
) -> list[list[int]]:
    """transformers `generate(do_sample=False)`, one prompt at a time (no padding), EOS ignored."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    model.generation_config.eos_token_id = None
    out = []
    for prompt in prompts:
        ids = torch.tensor([list(prompt)], device=device)
        # an explicit mask: without one, generate() takes every token equal to pad_token_id for padding
        ids = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
        )
        out.append(ids[0, len(prompt):].tolist())
    return out
