"""How much memory a model will hold once loaded, known before loading it: weights plus its fixed KV pool.

The cache policy must decide before a load whether the model fits (and refuse at once one that never
can), so the figure comes from the model's config and, for a GGUF, its tensor index, not from a load.
Pure arithmetic, torch-free; tests check it against what loaded models hold (DecoderModel.weight_bytes).

Rules (what the loader and model/linear.py do):
- a weight in the model dtype costs its parameters; on CPU, a float32 or bfloat16 projection and the head
  (the embedding, when tied) cost as much again for the packed copy the matmuls keep;
- a mixture-of-experts layer (ModelConfig.is_sparse) holds its router (a projection, packed like the others)
  and every expert, idle or not, with no packed copy of the experts (model/moe.py);
- with `quantization="gguf"` on CPU, the embedding, the head and each projection whose every part is of a
  block-kernel type cost their blocks' bytes, with no packed copy, and so do a sparse layer's experts where
  all three of its expert tensors are; the rest is dequantized to the dtype;
- with `quantization="int8"` (CPU only), every projection, the embedding and an untied head cost 1 byte per
  weight and 4 per output row (its float32 scale), with no packed copy; the rest (norms, biases) the dtype;
- with `quantization="fp8"` (a GPU), every projection the same; the embedding and head stay in the dtype.
"""

from __future__ import annotations

from collections.abc import Mapping

from flotilla_server.model.config import ModelConfig
from flotilla_server.model.gguf_meta import BLOCK_KERNEL_TYPES, EXPERT_PARTS, layer_projection_parts
from flotilla_server.model.source import HeldTensor, int8_layers

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PACKED_DTYPES = ("float32", "bfloat16")  # on CPU these projections keep a packed copy (model/linear.py)


def parameter_count(c: ModelConfig) -> int:
    """Parameters of the decoder as flotilla's runtime builds it (Q/K/V and gate/up fused, same sizes)."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    attention = c.hidden_size * (q + 2 * kv) + q * c.hidden_size
    if c.qkv_bias:
        attention += q + 2 * kv
    if c.o_bias:
        attention += c.hidden_size
    if c.qk_norm:
        attention += 2 * c.head_dim
    mlp = 3 * c.hidden_size * c.intermediate_size
    if c.mlp_bias:
        mlp += 2 * c.intermediate_size + c.hidden_size
    sparse = sum(c.is_sparse(layer) for layer in range(c.num_layers))
    per_layer = attention + (4 if c.sandwich_norms else 2) * c.hidden_size  # RMSNorms: Gemma 3's four
    embeddings = c.vocab_size * c.hidden_size
    head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    return (embeddings + c.num_layers * per_layer + (c.num_layers - sparse) * mlp
            + sparse * (_router_weights(c) + _expert_weights(c)) + c.hidden_size + head)


def _router_weights(c: ModelConfig) -> int:
    return 0 if c.moe is None else c.moe.num_experts * c.hidden_size


def _expert_weights(c: ModelConfig) -> int:
    """One sparse layer's experts: gate, up and down of each."""
    return 0 if c.moe is None else 3 * c.moe.num_experts * c.hidden_size * c.moe.expert_intermediate_size


def projection_weights(c: ModelConfig) -> int:
    """The weights of every matmul that keeps a packed copy: the projections (a sparse layer's router, not its
    experts) and the head (the embedding's, when tied); no biases."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    sparse = sum(c.is_sparse(layer) for layer in range(c.num_layers))
    attention = c.hidden_size * (q + 2 * kv) + q * c.hidden_size
    mlp = 3 * c.hidden_size * c.intermediate_size
    return (c.num_layers * attention + (c.num_layers - sparse) * mlp + sparse * _router_weights(c)
            + c.vocab_size * c.hidden_size)


def dense_weight_bytes(c: ModelConfig, dtype: str, device: str) -> int:
    """Every weight in `dtype`, with the packed copies on CPU."""
    packed = projection_weights(c) if device == "cpu" and dtype in PACKED_DTYPES else 0
    return (parameter_count(c) + packed) * DTYPE_BYTES[dtype]


def gguf_weight_bytes(c: ModelConfig, tensors: Mapping[str, HeldTensor], dtype: str, device: str) -> int:
    """A GGUF served with `quantization="gguf"`: the dense figure, less each weight that keeps its blocks
    (and its packed copy), plus those blocks."""
    total = dense_weight_bytes(c, dtype, device)
    if device != "cpu":
        return total
    per_weight = DTYPE_BYTES[dtype] * (2 if dtype in PACKED_DTYPES else 1)  # itself and its packed copy

    def swap(names: list[str], packed: bool = True) -> None:
        nonlocal total
        held = [tensors[n] for n in names]
        if all(t.type_id in BLOCK_KERNEL_TYPES for t in held):
            total += sum(t.nbytes - t.numel * (per_weight if packed else DTYPE_BYTES[dtype]) for t in held)

    # the embedding is the head when tied: one set of blocks serves both, and no packed copy is kept
    swap(["token_embd.weight"], packed=c.tie_word_embeddings)
    if "output.weight" in tensors:
        swap(["output.weight"])
    for layer in range(c.num_layers):
        for parts in layer_projection_parts(c, layer, c.model_type, tensors).values():
            swap([f"blk.{layer}.{part}.weight" for part in parts])
        if c.is_sparse(layer):
            swap([f"blk.{layer}.{part}.weight" for part in EXPERT_PARTS], packed=False)
    return total


def int8_weight_bytes(c: ModelConfig, dtype: str, device: str) -> int:
    """A model served with `quantization="int8"`: its int8 weights and their scales (source.int8_layers), the
    rest in `dtype`; no packed copies (`device`: int8 is served on CPU only, where this is what it holds)."""
    layers = int8_layers(c)
    int8 = sum(n * k for _, n, k in layers)
    return (parameter_count(c) - int8) * DTYPE_BYTES[dtype] + int8 + 4 * sum(n for _, n, _ in layers)


def fp8_weight_bytes(c: ModelConfig, dtype: str) -> int:
    """A model served with `quantization="fp8"` (a GPU): its projections' e4m3 weights and float32 scales, the
    rest (embedding, head, norms, biases) in `dtype`; no packed copies on a GPU."""
    layers = [(n, k) for name, n, k in int8_layers(c) if name not in ("model.embed_tokens", "lm_head")]
    fp8 = sum(n * k for n, k in layers)
    return (parameter_count(c) - fp8) * DTYPE_BYTES[dtype] + fp8 + 4 * sum(n for n, _ in layers)


def kv_block_bytes(c: ModelConfig, block_size: int, dtype: str) -> int:
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * DTYPE_BYTES[dtype]


def kv_pool_bytes(c: ModelConfig, block_size: int, dtype: str, num_kv_blocks: int | None,
                  kv_cache_memory_bytes: int) -> int:
    """The fixed pool: --num-kv-blocks blocks, or as many whole blocks as --kv-cache-memory holds."""
    per_block = kv_block_bytes(c, block_size, dtype)
    blocks = num_kv_blocks if num_kv_blocks is not None else kv_cache_memory_bytes // per_block
    return blocks * per_block


def model_bytes(c: ModelConfig, weight_bytes: int, dtype: str, block_size: int, num_kv_blocks: int | None,
                kv_cache_memory_bytes: int) -> int:
    """Weights (`dense_weight_bytes`, `gguf_weight_bytes` or `int8_weight_bytes`) plus KV pool: what the memory budget is charged."""
    return weight_bytes + kv_pool_bytes(c, block_size, dtype, num_kv_blocks, kv_cache_memory_bytes)
