"""write_llama_gguf: a small random Llama GGUF, written with the `gguf` package's own writer.

Its matrices are stored in one chosen tensor type (or, through `tensor_types`, some of them in others,
as a Q4_K_M file mixes Q4_K, Q6_K and Q8_0), quantized by `gguf.quants.quantize` where the package can (F16,
BF16, Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, ...). For the k-quants (and IQ4_XS) it cannot; their blocks are random bytes whose float16
scale fields are set so that the weights are finite, about zero-mean and small (Q4_K subtracts dmin x min
from d x scale x q, so dmin = 7.5 d centres it), valid blocks all the same. The tokenizer is byte-level BPE
over the 256 byte symbols plus a few merges and ChatML's special tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from tokenizers.pre_tokenizers import ByteLevel

T = GGMLQuantizationType
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 256, 256, 2, 4, 2  # rows of 256: K-quant blocks hold 256 values
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# type -> ({offset of a float16 field: its value}, block bytes), for the types `quantize` cannot write: d, and
# dmin where the type subtracts mins, chosen so the weights are about zero-mean and under about 0.3
_K_QUANT_F16_FIELDS = {T.Q4_K: ({0: 3e-4, 2: 7.5 * 3e-4}, 144), T.Q6_K: ({208: 3.5e-5}, 210),
                       T.Q5_K: ({0: 1.5e-4, 2: 15.5 * 1.5e-4}, 176), T.Q3_K: ({108: 1e-3}, 110),
                       T.Q2_K: ({80: 4e-3, 82: 1.5 * 4e-3}, 84), T.IQ4_XS: ({0: 1e-3}, 136)}


def vocabulary() -> tuple[list[str], list[int]]:
    """(tokens, token types): special tokens first (type 3, control), then bytes and merges (1)."""
    tokens = SPECIAL + sorted(ByteLevel.alphabet()) + [m.replace(" ", "") for m in MERGES]
    return tokens, [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))


def encode_as(rows: np.ndarray, tensor_type: T, rng: np.random.Generator) -> np.ndarray:
    if tensor_type == T.F32:
        return rows
    if tensor_type == T.F16:
        return rows.astype(np.float16)
    if tensor_type in _K_QUANT_F16_FIELDS:
        fields, size = _K_QUANT_F16_FIELDS[tensor_type]
        blocks = rng.integers(0, 256, (rows.size // 256, size), dtype=np.uint8)
        for off, value in fields.items():
            blocks[:, off:off + 2] = np.full((len(blocks), 1), value, np.float16).view(np.uint8)
        return blocks.reshape(*rows.shape[:-1], -1)
    return quantize(rows, tensor_type)


def write_llama_gguf(path: Path, tensor_type: T = T.F32, arch: str = "llama", pre: str = "smollm",
                     tokenizer_model: str = "gpt2", seed: int = 0, tensor_types: Mapping[str, T] | None = None,
                     **extra: Any) -> Path:
    """`tensor_types`: a matrix's type by its name without `blk.N.` and `.weight` (`attn_v`, `token_embd`),
    where it is not `tensor_type`."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    head_dim = HIDDEN // HEADS
    w = GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    for key, value in extra.items():
        w.add_string(key, value)

    def matrix(name: str, rows: int, cols: int) -> None:
        data = rng.normal(0, 0.08, (rows, cols)).astype(np.float32)
        kind = (tensor_types or {}).get(name.split(".")[-2], tensor_type)
        encoded = encode_as(data, kind, rng)
        w.add_tensor(name, encoded, raw_dtype=None if kind in (T.F32, T.F16) else kind)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + rng.normal(0, 0.1, HIDDEN)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), HIDDEN)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", HEADS * head_dim, HIDDEN)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HEADS * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")
    matrix("output.weight", len(tokens), HIDDEN)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
