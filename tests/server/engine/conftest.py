"""Fixtures for engine tests: small random Hugging Face models, the transformers reference, a driver.

FLOTILLA_TEST_DEVICE=cuda runs the engine on a GPU (default: cpu); the transformers reference stays on the CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import LoadedModel, load_model

from tests.support.hf_models import make_hf_model_dir

DEVICE = os.environ.get("FLOTILLA_TEST_DEVICE", "cpu")

# every architecture, with grouped-query attention and tied embeddings among them
ARCH_CASES = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {"num_key_value_heads": 1}),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"tie_word_embeddings": True}),
    "gemma3": ("gemma3_text", {"tie_word_embeddings": True}),
    # Phi-4-mini's shape: LongRoPE over half of each head (4 frequencies); sequences here stay under 512, the
    # short factors' range, where the runtime's rule is transformers'
    "phi3": ("phi3", {"partial_rotary_factor": 0.5, "max_position_embeddings": 2048,
                      "original_max_position_embeddings": 512,
                      "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                          "short_factor": [1.0, 1.2, 1.6, 2.4], "long_factor": [1.0, 3.0, 9.0, 27.0]}}),
    # mixtures of experts (8, top-2): Qwen3-MoE without renormalising its top-2 weights, Mixtral with one KV head
    "qwen3_moe": ("qwen3_moe", {"norm_topk_prob": False, "tie_word_embeddings": True}),
    "mixtral": ("mixtral", {"num_key_value_heads": 1}),
}


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory: pytest.TempPathFactory):
    """hf_model(case) -> (directory, LoadedModel), built once per session."""
    cache: dict[str, tuple[Path, LoadedModel]] = {}

    def get(case: str) -> tuple[Path, LoadedModel]:
        if case not in cache:
            arch, overrides = ARCH_CASES[case]
            path = make_hf_model_dir(arch, tmp_path_factory.mktemp(f"engine-{case}"), **overrides)
            cache[case] = (path, load_model(str(path), "float32", DEVICE))
        return cache[case]

    return get


def make_engine(loaded: LoadedModel, **config) -> EngineCore:
    return EngineCore(EngineConfig(model="unused", **{"device": DEVICE, **config}), loaded=loaded)


def run_to_completion(engine: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]],
                      max_steps: int = 10_000) -> dict[str, dict]:
    """Adds every request, steps until all finish; returns per request its tokens, text, finish reason."""
    results = {rid: {"token_ids": [], "text": "", "finish_reason": None} for rid in requests}
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            r = results[out.request_id]
            r["token_ids"] += out.token_ids
            r["text"] += out.text
            if out.finished:
                r["finish_reason"] = out.finish_reason
    assert not engine.has_unfinished(), "the engine did not finish within max_steps"
    assert engine.pool.num_free_blocks == engine.pool.num_blocks, "blocks leaked"
    return results
