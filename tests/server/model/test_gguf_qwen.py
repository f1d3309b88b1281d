"""GGUF files of architecture qwen2 (Q/K/V biases) and qwen3 (Q/K norms, head_dim from key_length), written in
the test with `gguf`'s writer, against transformers' own GGUF loader on the same file; and the refusal of an
architecture still unsupported, exit 2 from the CLI.

`write_decoder_gguf` is the writer the other test_gguf_* files share: any of the architectures, any
matrix type (gguf_files.encode_as: quantized by `gguf` where it can, random blocks with finite scales where it
cannot), optional biases, Q/K norms, a rope_freqs tensor, phi3's fused layout and partial rotary, experts.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flotilla_server.model import UnsupportedModelError, load_model
from gguf import GGUFWriter

from tests.support.hf_models import random_prompts
from tests.support.ports import free_port

from .gguf_files import MERGES, TEMPLATE, T, encode_as, vocabulary
from .gguf_reference import REPO, is_reference_greedy, load_reference
from .paged import paged_greedy

LAYERS = 2


def write_decoder_gguf(path: Path, arch: str = "llama", tensor_type: T = T.F32, *, hidden: int = 256,
                       ffn: int = 256, heads: int = 4, kv_heads: int = 2, head_dim: int | None = None,
                       qkv_bias: bool = False, qk_norm: bool = False, pre: str = "qwen2",
                       tensor_types: Mapping[str, T] | None = None, rope_freqs: np.ndarray | None = None,
                       tensors: Mapping[str, np.ndarray] | None = None, vocab_size: int | None = None, seed: int = 0,
                       vocab: tuple[list[str], list[int], list[str]] | None = None, layers: int = LAYERS,
                       sliding_window: int | None = None, fused: bool = False, rotary_dim: int | None = None,
                       extra_tensors: Mapping[str, np.ndarray] | None = None,
                       experts: tuple[int, int, int] | None = None, dense_layers: tuple[int, ...] = (),
                       **fields: Any) -> Path:
    """A small random GGUF. `arch` gemma3 adds its norms after each sublayer and ties the head (no
    `output.weight`), as llama.cpp's converter writes it. `tensor_types`: a matrix's type by its name without
    `blk.N.` and `.weight`;
    `tensors`: float32 weights by GGUF name, used instead of random ones (a file written from an HF model, whose
    `vocab_size` may exceed the test tokenizer's); `vocab`: (tokens, token types, merges), else gguf_files';
    `fused`: phi3's layout (Q/K/V rows in one `attn_qkv`, gate then up rows in one `ffn_up`); `rotary_dim`:
    `rope.dimension_count` (default head_dim); `extra_tensors`: float32 tensors written as they are (rope factors);
    `experts`: (count, used, width): every layer but `dense_layers` holds a float32 router `ffn_gate_inp` and 3-D
    `ffn_{gate,up,down}_exps` instead of ffn_gate/up/down, as llama.cpp writes qwen3moe and Mixtral (whose
    `llama` files give no expert_feed_forward_length: the width is feed_forward_length, `ffn`, there);
    `fields`: extra metadata (`{arch}.rope.scaling.type`: a string; ints: uint32; other values: float32)."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = vocab or (*vocabulary(), MERGES)
    head_dim = head_dim or hidden // heads
    w = GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    if sliding_window is not None:
        w.add_sliding_window(sliding_window)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(rotary_dim or head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab_size or len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    if experts is not None:
        w.add_expert_count(experts[0])
        w.add_expert_used_count(experts[1])
        if arch != "llama":
            w.add_expert_feed_forward_length(experts[2])
    for key, value in fields.items():
        (w.add_string if isinstance(value, str) else w.add_uint32 if isinstance(value, int) else w.add_float32)(
            key, value)

    def weights(name: str, shape: tuple[int, ...], scale: float, centre: float = 0.0) -> np.ndarray:
        if tensors is not None and name in tensors:
            return np.ascontiguousarray(tensors[name], dtype=np.float32)
        return (centre + rng.normal(0, scale, shape)).astype(np.float32)

    def matrix(name: str, rows: int, cols: int, *, stacked: int | None = None, scale: float = 0.08) -> None:
        kind = (tensor_types or {}).get(name.split(".")[-2], tensor_type)
        shape = (rows, cols) if stacked is None else (stacked, rows, cols)
        w.add_tensor(name, encode_as(weights(name, shape, scale), kind, rng),
                     raw_dtype=None if kind in (T.F32, T.F16) else kind)

    def vector(name: str, size: int, centre: float = 1.0, scale: float = 0.1) -> None:
        w.add_tensor(name, weights(name, (size,), scale, centre))

    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for name, values in (extra_tensors or {}).items():
        w.add_tensor(name, values.astype(np.float32))
    matrix("token_embd.weight", vocab_size or len(tokens), hidden)
    q, kv = heads * head_dim, kv_heads * head_dim
    gemma = arch == "gemma3"
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden)
        for part, rows in (("attn_qkv", q + 2 * kv),) if fused else (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            matrix(f"blk.{i}.{part}.weight", rows, hidden)
            if qkv_bias:
                vector(f"blk.{i}.{part}.bias", rows, 0.0, 0.2)
        if qk_norm:
            vector(f"blk.{i}.attn_q_norm.weight", head_dim)
            vector(f"blk.{i}.attn_k_norm.weight", head_dim)
        matrix(f"blk.{i}.attn_output.weight", hidden, q)
        if gemma:
            vector(f"blk.{i}.post_attention_norm.weight", hidden)
            vector(f"blk.{i}.post_ffw_norm.weight", hidden)
        vector(f"blk.{i}.ffn_norm.weight", hidden)
        if experts is not None and i not in dense_layers:
            count, _, width = experts
            w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", weights(f"blk.{i}.ffn_gate_inp.weight", (count, hidden), 0.3))
            matrix(f"blk.{i}.ffn_gate_exps.weight", width, hidden, stacked=count)
            matrix(f"blk.{i}.ffn_up_exps.weight", width, hidden, stacked=count)
            matrix(f"blk.{i}.ffn_down_exps.weight", hidden, width, stacked=count)
            continue
        if not fused:
            matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", 2 * ffn if fused else ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    vector("output_norm.weight", hidden)
    if not gemma:
        matrix("output.weight", vocab_size or len(tokens), hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_greedy_equals(path: Path, reference: Any, quantization: str = "none") -> None:
    """Greedy tokens of a batch (prefill in chunks of 5, sequences joining at steps 0-2) are transformers'."""
    loaded = load_model(str(path), "float32", "cpu", quantization)
    prompts = random_prompts([9, 14, 3], seed=7, vocab=loaded.config.vocab_size)
    got = paged_greedy(loaded.model, prompts, 6, chunk=5, start_steps=[0, 1, 2])
    for prompt, answer in zip(prompts, got, strict=True):
        assert is_reference_greedy(reference, prompt, answer), (prompt, answer)
    assert len({t for a in got for t in a}) > 1, "degenerate output: the comparison would be weak"


# qwen3: head_dim 128 (transformers' Qwen3 default, which its GGUF mapping keeps) with 4 heads of a 256 hidden
ARCHS = {"qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True, "head_dim": 128}}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_qwen_gguf_equals_transformers_gguf_loader(tmp_path: Path, arch: str) -> None:
    path = write_decoder_gguf(tmp_path / f"{arch}.Q8_0.gguf", arch, T.Q8_0, **ARCHS[arch])
    loaded = load_model(str(path), "float32", "cpu")
    config = loaded.config
    assert config.model_type == arch and config.qkv_bias == (arch == "qwen2") and config.qk_norm == (arch == "qwen3")
    assert config.head_dim == ARCHS[arch].get("head_dim", 64) and loaded.model.quantization() == "gguf:Q8_0"
    reference = load_reference(path, LAYERS, arch).model
    assert_greedy_equals(path, reference, "gguf")
    assert_greedy_equals(path, reference, "none")


def test_unsupported_architecture_names_the_file_and_the_supported_ones(tmp_path: Path) -> None:
    path = write_decoder_gguf(tmp_path / "m.gguf", "gemma2")
    message = ("GGUF architecture 'gemma2' is not supported: Flotilla loads GGUF files of architecture llama, "
               "qwen2, qwen3, gemma3, phi3")
    with pytest.raises(UnsupportedModelError, match=message):
        load_model(str(path))
    assert_cli_refuses(path, message)


def assert_cli_refuses(path: Path, message: str, *flags: str) -> None:
    """`flotilla-server --model FILE [flags]` exits 2 with the message on one line of stderr, before serving."""
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", str(path), "--port", str(free_port()), *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
