"""ModelConfig.from_hf folds each family's config.json into one shape, and refuses what it cannot run."""

from __future__ import annotations

import math

import pytest
from flotilla_server.model.config import ModelConfig, RopeScaling, UnsupportedModelError

BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# head_dim 16 at partial_rotary_factor 0.75: 12 rotary dims, 6 frequencies
PHI4_MINI_ROPE = {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], "long_factor": [2.0] * 6}


def cfg(**kw) -> ModelConfig:
    return ModelConfig.from_hf({**BASE, **kw})


def test_llama_defaults():
    c = cfg(model_type="llama", eos_token_id=2, bos_token_id=1)
    assert (c.head_dim, c.num_queries_per_kv, c.qkv_bias, c.o_bias, c.qk_norm) == (16, 2, False, False, False)
    assert c.eos_token_ids == (2,) and c.bos_token_id == 1 and c.rope_scaling is None


def test_llama_attention_bias_covers_o_proj():
    c = cfg(model_type="llama", attention_bias=True, mlp_bias=True)
    assert (c.qkv_bias, c.o_bias, c.mlp_bias) == (True, True, True)


def test_qwen2_has_qkv_bias_without_saying_so():
    c = cfg(model_type="qwen2")
    assert (c.qkv_bias, c.o_bias) == (True, False)


def test_qwen3_qk_norm_and_explicit_head_dim():
    c = cfg(model_type="qwen3", head_dim=32)
    assert c.qk_norm and c.head_dim == 32


def test_mha_when_kv_heads_absent():
    c = ModelConfig.from_hf({**{k: v for k, v in BASE.items() if k != "num_key_value_heads"}, "model_type": "llama"})
    assert c.num_kv_heads == 4


@pytest.mark.parametrize("style", ["v4", "v5"])
def test_llama3_rope_scaling_in_both_config_styles(style):
    if style == "v4":
        c = cfg(model_type="llama", rope_theta=500000.0, rope_scaling=LLAMA3_ROPE)
    else:
        c = cfg(model_type="llama", rope_parameters={**LLAMA3_ROPE, "rope_theta": 500000.0})
    assert c.rope_theta == 500000.0
    assert c.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_default_rope_parameters_mean_no_scaling():
    c = cfg(model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert c.rope_scaling is None and c.rope_theta == 1e6


def test_eos_list_and_tied_embeddings():
    c = cfg(model_type="llama", eos_token_id=[128001, 128009], tie_word_embeddings=True)
    assert c.eos_token_ids == (128001, 128009) and c.tie_word_embeddings


def test_phi3_config_as_phi4_mini_writes_it():
    """transformers 4 style: partial_rotary_factor and original_max_position_embeddings at the top level."""
    c = cfg(model_type="phi3", partial_rotary_factor=0.75, max_position_embeddings=131072, sliding_window=262144,
            original_max_position_embeddings=4096, rope_theta=10000.0, rope_scaling=PHI4_MINI_ROPE,
            tie_word_embeddings=True, attention_bias=True)
    assert (c.rotary_dim, c.head_dim, c.max_position_embeddings, c.tie_word_embeddings) == (12, 16, 131072, True)
    assert (c.qkv_bias, c.o_bias, c.mlp_bias, c.qk_norm) == (False, False, False, False)  # Phi-3 has no biases
    s = c.rope_scaling
    assert (s.rope_type, s.factor, s.original_max_position_embeddings) == ("longrope", 32.0, 4096)
    assert s.short_factor == tuple(PHI4_MINI_ROPE["short_factor"]) and s.long_factor == (2.0,) * 6
    assert s.attention_factor == math.sqrt(1 + math.log(32) / math.log(4096))  # Phi-4-mini's GGUF: 1.190238


def test_phi3_longrope_in_transformers_5_style_with_its_own_factors():
    rope = {"rope_type": "longrope", "rope_theta": 250000.0, "partial_rotary_factor": 0.5, "factor": 2.0,
            "attention_factor": 1.25, "original_max_position_embeddings": 256, "short_factor": [1.0] * 4,
            "long_factor": [3.0] * 4}
    c = cfg(model_type="phi3", rope_parameters=rope)
    assert (c.rotary_dim, c.rope_theta) == (8, 250000.0)
    assert c.rope_scaling == RopeScaling("longrope", 2.0, original_max_position_embeddings=256,
                                         short_factor=(1.0,) * 4, long_factor=(3.0,) * 4, attention_factor=1.25)


@pytest.mark.parametrize("legacy", ["su", "yarn"])
def test_phi3_legacy_rope_types_are_longrope_as_transformers_reads_them(legacy):
    c = cfg(model_type="phi3", original_max_position_embeddings=512,
            rope_scaling={"type": legacy, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8})
    assert c.rope_scaling.rope_type == "longrope" and c.rope_scaling.attention_factor == 1.0  # 512 / 512: no factor


def test_phi3_without_rope_scaling_rotates_whole_heads():
    c = cfg(model_type="phi3", rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 1.0})
    assert c.rope_scaling is None and c.rotary_dim == c.head_dim == 16


def test_other_families_rotate_whole_heads_whatever_partial_rotary_factor_says():
    assert cfg(model_type="llama", partial_rotary_factor=0.5).rotary_dim == 16  # transformers' Llama ignores it


@pytest.mark.parametrize(("extra", "windows"), [
    ({"model_type": "mistral", "sliding_window": 128}, (128, 128)),
    ({"model_type": "mistral", "sliding_window": None}, ()),
    ({"model_type": "mistral", "sliding_window": 128, "use_sliding_window": False}, ()),
    ({"model_type": "qwen2", "sliding_window": 128, "use_sliding_window": False}, ()),
    ({"model_type": "qwen2", "sliding_window": 128, "use_sliding_window": True, "max_window_layers": 1}, (0, 128)),
    ({"model_type": "qwen3", "sliding_window": 128, "use_sliding_window": True,
      "layer_types": ["sliding_attention", "full_attention"]}, (128, 0)),
    ({"model_type": "phi3", "sliding_window": 128}, (128, 128)),  # Phi-3-mini-4k: a window of 2047 in 4096 positions
    ({"model_type": "phi3", "sliding_window": None}, ()),
    # transformers' Mixtral applies any window set, whatever use_sliding_window says (it reads no such key)
    ({"model_type": "mixtral", "num_local_experts": 4, "sliding_window": 128, "use_sliding_window": False},
     (128, 128)),
    ({"model_type": "mixtral", "num_local_experts": 4, "sliding_window": None}, ()),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "sliding_window": 128}, ()),  # use_sliding_window is false by default
])
def test_sliding_windows_as_transformers_applies_them(extra, windows):
    """Windowed layers are masked (model/attention.py), so the context stays the model's own."""
    c = cfg(**extra)
    assert c.layer_windows == windows and c.max_position_embeddings == 512


@pytest.mark.parametrize(("extra", "message"), [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"model_type": "qwen2_moe", "shared_expert_intermediate_size": 64},
     r"model_type 'qwen2_moe' \(Qwen2-MoE: a shared expert with its own sigmoid gate beside the routed ones\) is not "
     "supported: Flotilla runs the mixture-of-experts models qwen3_moe, mixtral .routed experts only. and the dense "
     "llama, mistral"),
    ({"model_type": "qwen3_moe", "moe_intermediate_size": 32}, "needs num_experts or num_local_experts"),
    ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 5},
     r"num_experts_per_tok \(5\) must be at most the number of experts \(4\)"),
    ({"model_type": "llama", "architectures": ["LlamaForSequenceClassification"]}, "expected LlamaForCausalLM"),
    ({"model_type": "llama", "hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"model_type": "llama", "num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"model_type": "gemma3", "text_config": {}}, "holds a SigLIP vision tower .vision_config. and a multi_modal_projector"),
    ({"model_type": "gemma3_text", "attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 is not supported"),
    ({"model_type": "gemma3_text", "hidden_activation": "relu", "sliding_window": 4}, "hidden activation 'relu' is not supported"),
    ({"model_type": "gemma3_text", "layer_types": ["chunked_attention"] * 2}, "must name full_attention or sliding"),
    ({"model_type": "gemma3_text", "sliding_window": None}, "sliding_window must be >= 1"),
    ({"model_type": "phi3", "hidden_act": "gelu_new"}, "hidden_act 'gelu_new' is not supported: only 'silu' is"),
    ({"model_type": "phi3", "architectures": ["Phi3ForSequenceClassification"]}, "expected Phi3ForCausalLM"),
    ({"model_type": "phi3", "rope_scaling": LLAMA3_ROPE},
     "rope_type 'llama3' is not supported for model_type 'phi3': use one of default, longrope"),
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}},
     "longrope RoPE scaling needs long_factor, original_max_position_embeddings in config.json"),
    ({"model_type": "phi3", "original_max_position_embeddings": 64,
      "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 7, "long_factor": [1.0] * 8}},
     r"longrope short_factor must be 8 positive numbers \(one per rotary frequency\), got 7 values"),
    ({"model_type": "phi3", "partial_rotary_factor": 0.3125},
     r"RoPE must rotate an even number of dimensions from 2 to head_dim \(16\), got 5"),
])
def test_unsupported_configs_say_what_to_change(extra, message):
    with pytest.raises(UnsupportedModelError, match=message):
        cfg(**extra)


def test_qwen3_moe_is_qwen3_attention_with_experts_on_its_sparse_layers():
    c = cfg(model_type="qwen3_moe", head_dim=32, attention_bias=True, num_hidden_layers=6, num_experts=16,
            num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=2,
            mlp_only_layers=[3])
    assert (c.qk_norm, c.qkv_bias, c.o_bias, c.head_dim) == (True, True, True, 32)
    assert (c.moe.num_experts, c.moe.num_experts_per_tok, c.moe.expert_intermediate_size) == (16, 4, 32)
    assert c.moe.norm_topk_prob and not c.moe.float32_scaling and c.intermediate_size == 128  # the dense layers'
    assert [c.is_sparse(i) for i in range(6)] == [False, True, False, False, False, True]


def test_mixtral_is_mistral_attention_with_experts_everywhere():
    c = cfg(model_type="mixtral", num_local_experts=8, num_experts_per_tok=2, attention_bias=True)
    assert (c.qk_norm, c.qkv_bias, c.o_bias) == (False, False, False)  # transformers reads no attention_bias
    assert c.moe.expert_intermediate_size == 128 and c.moe.norm_topk_prob and c.moe.float32_scaling
    assert all(c.is_sparse(i) for i in range(2)) and not cfg(model_type="llama").is_sparse(0)


GEMMA3 = {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 7, "head_dim": 32, "sliding_window": 512,
          "query_pre_attn_scalar": 256}


def test_gemma3_in_transformers_v4_style():
    """The hub's Gemma 3 config.json: top-level RoPE bases, rope_scaling for the global layers only, and (without
    layer_types) every sixth layer global."""
    c = ModelConfig.from_hf({**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                             "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert c.layer_windows == (512,) * 5 + (0, 512) and c.window(5) == 0 and c.window(6) == 512
    assert (c.rope_theta, c.local_rope_theta, c.rope_scaling) == (1e6, 1e4, RopeScaling("linear", 8.0))
    assert c.attention_scale == 256 ** -0.5 and c.embedding_scale == 64 ** 0.5 and c.norm_weight_offset == 1.0
    assert c.sandwich_norms and c.qk_norm and c.tie_word_embeddings and c.max_position_embeddings == 512


def test_gemma3_in_transformers_v5_style():
    c = ModelConfig.from_hf({**GEMMA3, "layer_types": ["full_attention"] + ["sliding_attention"] * 6,
                             "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}})
    assert c.layer_windows == (0,) + (512,) * 6
    assert (c.rope_theta, c.local_rope_theta, c.rope_scaling) == (5e5, 2e4, None)
