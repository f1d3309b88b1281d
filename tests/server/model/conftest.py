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

# LongRoPE's factors for head_dim 16 (8 frequencies); original length 512 and max_position_embeddings 2048
# give the default attention factor sqrt(1 + ln 4 / ln 512)
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0],
                 "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]}

# name -> (arch, overrides): every architecture, with grouped-query attention, tied embeddings, sharding
VARIANTS = {
    "llama-gqa": ("llama", {}),
    "llama-tied-mha": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "mistral-gqa": ("mistral", {"num_key_value_heads": 1, "sliding_window": 32}),  # a window the longer prompts outrun
    "qwen2-bias-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-qknorm-sharded": ("qwen3", {"max_shard_size": "100KB"}),
    "gemma3-sliding-tied": ("gemma3_text", {"tie_word_embeddings": True}),
    # Phi-3/4: half of each head rotated, tied, a sliding window the longer test sequences outrun
    "phi3-partial-tied-window": ("phi3", {"partial_rotary_factor": 0.5, "tie_word_embeddings": True,
                                          "sliding_window": 16}),
    # Phi-3.5-mini's shape: LongRoPE over whole heads; every test sequence is under 512 (the short factors)
    "phi3-longrope": ("phi3", {"max_position_embeddings": 2048, "original_max_position_embeddings": 512,
                               "rope_parameters": PHI3_LONGROPE}),
    # mixtures of experts: 8 experts, top-2; Qwen3-MoE's layer 1 dense, its top-2 weights renormalised
    "qwen3moe-dense-layer": ("qwen3_moe", {}),
    "mixtral-window": ("mixtral", {"sliding_window": 512}),  # a window wider than every test sequence
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
