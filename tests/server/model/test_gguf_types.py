"""The GGUF types Q5_0, Q5_1, Q2_K, Q3_K and Q5_K in the quantized path (model/quant_blocks.py, quant_decoders.py,
kernels/kquant_matmul.cpp for Q5_K; Q5_0's and Q5_1's kernels in detail: test_q5_kernels.py): dequantization
with `gguf.quants.dequantize`'s bits, products within the float bound of tests/server/model/test_quant_kernels.py,
models of mixed types (rows not a multiple of 256 in Q5_0/Q5_1/Q8_0, as llama.cpp stores them) held as blocks
against the same file dequantized and against transformers, and a type still unsupported refused by name, exit
2 from the CLI.

`gguf` cannot quantize Q2_K, Q3_K or Q5_K: their blocks are random bytes with finite fp16 scale fields (every
6-bit scale and min, every integer); Q5_0 and Q5_1 are random bytes too (any 5-bit integer) and `quantize`'s.
(test_gguf.py's test_every_supported_type_equals_transformers runs each type through a whole small model too.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from flotilla_server.model import UnsupportedModelError, load_model, quant_blocks
from flotilla_server.model.gguf_file import GGUFFile
from flotilla_server.model.quant_blocks import (
    BLOCK_BYTES,
    BLOCK_WEIGHTS,
    MANY_ROWS,
    dequantize_rows,
    quant_matmul,
)
from flotilla_server.model.quant_linear import QuantizedEmbedding, QuantizedLinear
from gguf.quants import dequantize, quantize

from .gguf_files import T
from .gguf_reference import load_reference
from .kernel_isas import assert_dequantizer_bits, assert_rows_independent, available_isas
from .test_gguf_qwen import assert_cli_refuses, assert_greedy_equals, write_decoder_gguf
from .test_int8_loading import logits
from .test_quant_kernels import activations_forced, assert_within_float_bound, native, on_one_and_two_threads

NEW_TYPES = [T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K]
# byte offsets of each block's fp16 fields (d, and dmin or m where the type has one)
HALVES = {T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q5_K: (0, 2)}


def random_blocks(qtype: T, n: int, k: int, seed: int = 0, finite: bool = True) -> np.ndarray:
    """uint8 [n, bytes per row] of random blocks; with `finite`, each fp16 field's exponent 31 made 15."""
    rng = np.random.default_rng([int(qtype), n, k, seed])
    size = BLOCK_BYTES[qtype]
    raw = rng.integers(0, 256, (n, k // BLOCK_WEIGHTS[qtype], size), dtype=np.uint8)
    if finite:
        for at in HALVES[qtype]:
            halves = raw[..., at:at + 2].copy().view(np.uint16)
            halves[(halves & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)
            raw[..., at:at + 2] = halves.view(np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype", NEW_TYPES, ids=lambda t: t.name)
def test_dequantize_rows_has_gguf_bits(qtype: T) -> None:
    for n, k in ((1, 256), (7, 512), (33, 768)):
        blocks = random_blocks(qtype, n, k)
        got = dequantize_rows(torch.from_numpy(blocks), qtype).numpy()
        assert np.array_equal(got.view(np.uint32), dequantize(blocks, qtype).view(np.uint32)), (n, k)
    if qtype in (T.Q5_0, T.Q5_1):  # and the blocks gguf writes
        weights = np.random.default_rng(1).normal(0, 0.1, (5, 320)).astype(np.float32)
        blocks = quantize(weights, qtype)
        got = dequantize_rows(torch.from_numpy(blocks), qtype).numpy()
        assert np.array_equal(got, dequantize(blocks, qtype))
        assert np.abs(got - weights).max() < 0.02


@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("finite", [True, False], ids=["finite-scales", "any-bytes"])
def test_native_q5_k_dequantizer_has_gguf_bits_on_every_instruction_set(finite: bool) -> None:
    for n, k in ((1, 256), (7, 512), (33, 768), (9, 256 * 17)):
        blocks = random_blocks(T.Q5_K, n, k, finite=finite)
        with np.errstate(all="ignore"):
            expected = dequantize(blocks, T.Q5_K).view(np.uint32)
        assert_dequantizer_bits(blocks, T.Q5_K, expected)


@native
@pytest.mark.usefixtures("restore_isa", "threads")
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 16, 40])
def test_native_q5_k_products_within_the_float_bound_on_every_instruction_set(rows: int) -> None:
    """The kernel (under MANY_ROWS rows) and the many-row path (40), 1 and 2 threads, n not a multiple of any
    SIMD width, a row of 17 super-blocks; and the kernel itself on one thread and two has the same bits."""
    assert quant_blocks.few_rows_product(T.Q5_K) is not None, "Q5_K must have a native kernel"
    torch.manual_seed(rows)
    with activations_forced("float"):
        for n, k in ((7, 256), (33, 768), (9, 256 * 17)):
            blocks = random_blocks(T.Q5_K, n, k)
            x = torch.randn(rows, k) * torch.logspace(-2, 1, k)
            for isa in available_isas():
                y = on_one_and_two_threads(isa, x, torch.from_numpy(blocks), T.Q5_K)
                assert_within_float_bound(y, x, blocks, T.Q5_K)
                if rows < MANY_ROWS:  # the kernel: the k-quants keep float activations in every mode, bit for bit
                    with activations_forced("int8"):
                        assert torch.equal(quant_matmul(x, torch.from_numpy(blocks), T.Q5_K), y)
                kernels = []
                for count in (1, 2):
                    torch.set_num_threads(count)
                    kernels.append(torch.ops.flotilla.quant_matmul(x, torch.from_numpy(blocks), int(T.Q5_K)))
                assert torch.equal(kernels[0], kernels[1]), isa


@native
@pytest.mark.usefixtures("restore_isa")
def test_a_q5_k_rows_result_does_not_depend_on_the_other_rows() -> None:
    assert_rows_independent([T.Q5_K], lambda qtype: torch.from_numpy(random_blocks(qtype, 33, 768)), 768)


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K], ids=lambda t: t.name)
def test_portable_types_multiply_within_the_float_bound(qtype: T) -> None:
    """No native kernel: quant_matmul decodes tiles with the torch decoders at every row count."""
    assert quant_blocks.few_rows_product(qtype) is None
    torch.manual_seed(0)
    for rows in (1, 3, MANY_ROWS + 1):
        for n, k in ((7, 256), (33, 768)):
            blocks = random_blocks(qtype, n, k)
            x = torch.randn(rows, k)
            assert_within_float_bound(quant_matmul(x, torch.from_numpy(blocks), qtype), x, blocks, qtype)


# ---- models: the mixes llama.cpp writes

# hidden 320 (10 blocks of 32, not a multiple of 256): every matrix whose rows are 320 long in Q5_0, Q5_1 or Q8_0,
# as llama.cpp stores them; the down projection's rows (512) in Q5_K, the type of the rest of a Q5_K_M file
NARROW = {"token_embd": T.Q8_0, "attn_q": T.Q5_0, "attn_k": T.Q5_0, "attn_v": T.Q5_1, "attn_output": T.Q5_0,
          "ffn_gate": T.Q5_1, "ffn_up": T.Q5_0, "ffn_down": T.Q5_K, "output": T.Q8_0}
# hidden 256: Q3_K_M's and Q2_K's types side by side (V and the down projection wider, as llama.cpp gives them)
LOW_BITS = {"token_embd": T.Q3_K, "attn_q": T.Q2_K, "attn_k": T.Q3_K, "attn_v": T.Q5_K, "attn_output": T.Q3_K,
            "ffn_gate": T.Q2_K, "ffn_up": T.Q3_K, "ffn_down": T.Q5_K, "output": T.Q6_K}
MIXES = {"narrow": (NARROW, {"hidden": 320, "ffn": 512}), "low-bits": (LOW_BITS, {})}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_a_mixed_model_keeps_its_blocks_and_equals_the_dequantized_model_and_transformers(tmp_path: Path,
                                                                                          mix: str) -> None:
    types, shape = MIXES[mix]
    path = write_decoder_gguf(tmp_path / f"m-{mix}.gguf", "llama", tensor_types=types, **shape)
    blocks = load_model(str(path), "float32", "cpu", "gguf")
    dense = load_model(str(path), "float32", "cpu", "none")
    net = blocks.model
    assert net.quantization() == "gguf:" + "+".join(sorted({t.name for t in types.values()}))
    assert isinstance(net.embed_tokens, QuantizedEmbedding) and isinstance(net.lm_head, QuantizedLinear)
    assert all(isinstance(m, QuantizedLinear) for layer in net.layers
               for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj))
    file = GGUFFile(path)  # every matrix held as the file's bytes, the norms in float32
    assert net.weight_bytes() == sum(t.data.nbytes for t in file.tensors)
    ids = list(range(3, 40))
    with torch.inference_mode():
        assert torch.equal(net.embed_tokens(torch.tensor(ids)), dense.model.embed_tokens.weight[ids])  # gguf's bits
    with activations_forced("float") if quant_blocks._quant_matmul is not None else contextlib.nullcontext():
        for length in (9, MANY_ROWS + 5):  # the kernels, then the many-row path
            got, want = logits(net, ids[:length]), logits(dense.model, ids[:length])
            assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (length, (got - want).abs().max())
        assert_greedy_equals(path, load_reference(path, num_layers=2).model, "gguf")


def test_a_type_still_unsupported_is_refused_by_name(tmp_path: Path) -> None:
    path = write_decoder_gguf(tmp_path / "m.gguf", "qwen2", tensor_types={"ffn_down": T.IQ4_XS}, qkv_bias=True)
    message = "m.gguf holds tensors of type IQ4_XS, which Flotilla does not dequantize; supported: BF16, F16, F32, Q2_K"
    with pytest.raises(UnsupportedModelError, match=message):
        load_model(str(path))
    assert_cli_refuses(path, message)
