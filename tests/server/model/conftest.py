"""Fixtures: small random Hugging Face models (saved with save_pretrained) and their transformers twins.

FLOTILLA_TEST_DEVICE=cuda runs the equality and half-precision tests on a GPU (default: cpu).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from flotilla_server.model import quant_blocks

from tests.support.hf_models import make_hf_model_dir

DEVICE = os.environ.get("FLOTILLA_TEST_DEVICE", "cpu")

# name -> (arch, overrides): every architecture, with grouped-query attention, tied embeddings, sharding
VARIANTS = {
    "llama-gqa": ("llama", {}),
    "llama-tied-mha": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "mistral-gqa": ("mistral", {"num_key_value_heads": 1}),
    "qwen2-bias-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-qknorm-sharded": ("qwen3", {"max_shard_size": "100KB"}),
    "gemma3-sliding-tied": ("gemma3_text", {"tie_word_embeddings": True}),
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


@pytest.fixture
def restore_isa():
    """The native kernels' instruction set as it was, after a test that forces others."""
    before = quant_blocks.active_isa()
    yield
    quant_blocks.force_isa(before)


@pytest.fixture
def threads():
    """torch's thread count as it was, after a test that sets it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
