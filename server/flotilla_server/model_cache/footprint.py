"""How much memory a model will hold once loaded, known before loading it: weights plus its fixed KV pool.

The cache policy must decide before a load whether the model fits (and refuse at once one that never
can), so the figure comes from the model's config, not from a load. Pure arithmetic, torch-free; a test
checks it against the parameters of a loaded model.
"""

from __future__ import annotations

from flotilla_server.model.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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
    per_layer = attention + mlp + 2 * c.hidden_size  # two RMSNorms
    embeddings = c.vocab_size * c.hidden_size
    head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    return embeddings + c.num_layers * per_layer + c.hidden_size + head


def kv_block_bytes(c: ModelConfig, block_size: int, dtype: str) -> int:
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * DTYPE_BYTES[dtype]


def kv_pool_bytes(c: ModelConfig, block_size: int, dtype: str, num_kv_blocks: int | None,
                  kv_cache_memory_bytes: int) -> int:
    """The fixed pool: --num-kv-blocks blocks, or as many whole blocks as --kv-cache-memory holds."""
    per_block = kv_block_bytes(c, block_size, dtype)
    blocks = num_kv_blocks if num_kv_blocks is not None else kv_cache_memory_bytes // per_block
    return blocks * per_block


def model_bytes(c: ModelConfig, dtype: str, block_size: int, num_kv_blocks: int | None,
                kv_cache_memory_bytes: int) -> int:
    """Weights plus KV pool: what the memory budget is charged for this model."""
    return (parameter_count(c) * DTYPE_BYTES[dtype]
            + kv_pool_bytes(c, block_size, dtype, num_kv_blocks, kv_cache_memory_bytes))
