"""Gemma 3 GGUF files written in the test with `gguf`'s writer (sliding-window layers around a global one, Q/K
norms, the four norms a layer stored as 1 + weight, a tied head), against transformers' own GGUF loader on the
same file, dequantized and from the file's blocks; prompts outrun the sliding window."""

from __future__ import annotations

from pathlib import Path

import pytest
from flotilla_server.model import load_model

from .gguf_files import T
from .gguf_reference import load_reference
from .test_gguf_qwen import assert_greedy_equals, write_decoder_gguf

# six layers: llama.cpp's and transformers' Gemma 3 make every sixth layer global; head_dim 256, transformers'
# default query_pre_attn_scalar, which its GGUF mapping keeps, and llama.cpp's score scale for this size
LAYERS, WINDOW, HEAD_DIM = 6, 4, 256


@pytest.fixture(scope="module")
def gemma3_file(tmp_path_factory) -> tuple[Path, object]:
    path = write_decoder_gguf(tmp_path_factory.mktemp("gemma3") / "g.Q8_0.gguf", "gemma3", T.Q8_0, hidden=64,
                              ffn=128, heads=2, kv_heads=1, head_dim=HEAD_DIM, qk_norm=True, layers=LAYERS,
                              sliding_window=WINDOW)
    return path, load_reference(path, LAYERS, "gemma3_text").model


def test_config_follows_llama_cpp(gemma3_file) -> None:
    path, _ = gemma3_file
    c = load_model(str(path), "float32", "cpu").config
    assert c.layer_windows == (WINDOW,) * 5 + (0,) and c.local_rope_theta == 10000.0
    assert c.attention_scale == HEAD_DIM ** -0.5 and c.embedding_scale == 64 ** 0.5
    assert c.sandwich_norms and c.qk_norm and c.tie_word_embeddings and c.hidden_act == "gelu_pytorch_tanh"


@pytest.mark.parametrize("quantization", ["gguf", "none"])
def test_gemma3_gguf_equals_transformers_gguf_loader(gemma3_file, quantization: str) -> None:
    path, reference = gemma3_file
    assert_greedy_equals(path, reference, quantization)
