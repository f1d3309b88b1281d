"""The files `flotilla-bench lora` serves, written without transformers or peft: a random Llama of workloads.py
(`llama-100m`, or `llama-small` for `--small`) as a Hugging Face directory, and LoRA adapters of it in PEFT's
layout, so that the server reads them exactly as it reads a real checkpoint and a real adapter.

- The base: `config.json` (model_type llama), `generation_config.json`, `model.safetensors` under Hugging Face
  names (the runtime's fused Q/K/V and gate/up split back, as workloads.to_transformers splits them),
  `tokenizer.json` and `tokenizer_config.json` (tiny's byte-level BPE, which the random Llamas share).
- An adapter: `adapter_config.json` as peft 0.21 writes one (peft_type LORA, `r`, `lora_alpha`,
  `target_modules`, no DoRA, rsLoRA or biases) and `adapter_model.safetensors` whose keys are peft's
  (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`, [r, in]; `lora_B`, [out, r]). Both factors
  are random and seeded: A ~ N(0, 1/in), B ~ N(0, 0.02²), so the adapter moves the output (peft's own default
  makes B zero) and no product overflows.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from flotilla_server.bench.workloads import build_model
from flotilla_server.model import ModelConfig
from flotilla_server.model.lora_adapter import CONFIG_FILE, TARGETS, WEIGHTS_FILE, part_sizes
from flotilla_server.model.tiny import BOS, CHAT_TEMPLATE, EOS, SPECIAL_TOKENS, build_byte_bpe

MODULE_GROUP = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
ALL_TARGETS = tuple(TARGETS)


def hf_config(c: ModelConfig) -> dict:
    """The `config.json` that ModelConfig.from_hf reads back as `c` (a Llama)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta, "tie_word_embeddings": c.tie_word_embeddings,
            "attention_bias": False, "mlp_bias": False, "bos_token_id": c.bos_token_id,
            "eos_token_id": list(c.eos_token_ids), "torch_dtype": "float32"}


def hf_state_dict(model: torch.nn.Module, c: ModelConfig) -> dict[str, torch.Tensor]:
    """The decoder's weights under Hugging Face names, fused projections split back into their parts."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().to("cpu", torch.float32)
        if ".qkv_proj." in name:
            for part, t in zip(("q_proj", "k_proj", "v_proj"), tensor.split((q, kv, kv)), strict=True):
                out["model." + name.replace("qkv_proj", part)] = t.contiguous()
        elif ".gate_up_proj." in name:
            for part, t in zip(("gate_proj", "up_proj"), tensor.chunk(2), strict=True):
                out["model." + name.replace("gate_up_proj", part)] = t.contiguous()
        elif name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        else:
            out[name if name.startswith("lm_head.") else "model." + name] = tensor.contiguous()
    return out


def write_tokenizer(path: Path) -> None:
    tok = build_byte_bpe()
    tok.save(str(path / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "rstrip": False, "normalized": False,
                                       "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "added_tokens_decoder": added,
         "chat_template": CHAT_TEMPLATE}, indent=1))


def write_base(name: str, path: Path, seed: int = 0) -> ModelConfig:
    """workloads.build_model(`name`) (seeded random weights) saved as a Hugging Face directory at `path`."""
    loaded = build_model(name, seed=seed)
    c = loaded.config
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config(c), indent=1))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": c.bos_token_id,
                                                             "eos_token_id": list(c.eos_token_ids)}))
    save_file(hf_state_dict(loaded.model, c), str(path / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(path)
    return c


def write_adapter(base: ModelConfig, path: Path, rank: int, seed: int, targets: tuple[str, ...] = ALL_TARGETS,
                  alpha: float | None = None, base_name: str = "") -> Path:
    """A random LoRA adapter of `base` (every layer, `targets`) saved at `path` in peft's layout."""
    gen = torch.Generator().manual_seed(seed)
    sizes = part_sizes(base)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(base.num_layers):
        for module in targets:
            out_size, in_size = sizes[module]
            key = f"base_model.model.model.layers.{layer}.{MODULE_GROUP[module]}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_size, generator=gen) / in_size ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_size, rank, generator=gen) * 0.02
    path.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_name, "r": rank,
              "lora_alpha": 2 * rank if alpha is None else alpha, "lora_dropout": 0.0, "target_modules": list(targets),
              "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None,
              "init_lora_weights": False, "inference_mode": True, "rank_pattern": {}, "alpha_pattern": {},
              "layers_to_transform": None, "layers_pattern": None}
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=1))
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    return path
