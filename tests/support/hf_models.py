"""Small random Hugging Face model directories, built with transformers, for tests that compare with it.

    path = make_hf_model_dir("qwen3", tmp_path / "m", tie_word_embeddings=True)
    loaded = load_model(str(path), "float32", "cpu")                       # Flotilla
    ref = transformers.AutoModelForCausalLM.from_pretrained(path)          # reference

`arch` is one of ARCHS. Keyword overrides go to the transformers config class (e.g.
`num_key_value_heads=4`, `rope_scaling={...}`, `tie_word_embeddings=True`), except `seed` and
`max_shard_size` (e.g. "100KB" to force several `*.safetensors` shards and an index file).

The directory holds `config.json`, `generation_config.json`, safetensors weights, a byte-level BPE
`tokenizer.json` (vocab 384, BOS `<s>` prepended, EOS `</s>`) and a `tokenizer_config.json` with a
ChatML-style chat template that uses `bos_token` and `raise_exception`. Norm weights and biases are
randomised too (transformers initialises them to constants), so every weight matters to the output.

`random_prompts` and `hf_greedy` (the transformers reference: greedy, one prompt at a time) serve the
equality tests of the model runtime and of the engine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from flotilla_server.model.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS, build_byte_bpe

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", "qwen3_moe", "mixtral")
VOCAB_SIZE = 384
BOS_ID, EOS_ID = 380, 381  # "<s>", "</s>" in the tokenizer below

_BASE: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention
    "max_position_embeddings": 1024,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": None,
    "tie_word_embeddings": False,
    "initializer_range": 0.1,  # larger than the default 0.02: greedy output varies instead of repeating
}
_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},  # q/k/v biases are built in
    "qwen3": {"head_dim": 32},  # explicit head_dim != hidden / heads
    # sliding layers around a global one, a window the tests' prompts outrun, a score scale != head_dim ** -0.5
    "gemma3_text": {"head_dim": 32, "num_hidden_layers": 3, "sliding_window": 16, "query_pre_attn_scalar": 24,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
    "phi3": {},  # Q/K/V and gate/up fused in the checkpoint (qkv_proj, gate_up_proj), no biases
    # 8 experts, top-2, each narrower than the dense layer 1 (mlp_only_layers) between two sparse ones
    "qwen3_moe": {"head_dim": 32, "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "mlp_only_layers": [1], "norm_topk_prob": True},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": None},
}


def _config_class(arch: str) -> type:
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma3_text": transformers.Gemma3TextConfig,
        "phi3": transformers.Phi3Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "mixtral": transformers.MixtralConfig,
    }
    if arch not in classes:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    return classes[arch]


def make_hf_model_dir(arch: str, path: str | Path, **overrides: Any) -> Path:
    """Builds and saves a small random `arch` model at `path`; returns `path`."""
    import transformers

    seed = overrides.pop("seed", 0)
    max_shard_size = overrides.pop("max_shard_size", "50GB")
    path = Path(path)
    config = _config_class(arch)(**{**_BASE, **_ARCH_DEFAULTS[arch], **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(path, max_shard_size=max_shard_size)
    write_tokenizer_files(path)
    return path


def write_tokenizer_files(path: str | Path) -> None:
    """`tokenizer.json` + `tokenizer_config.json` (with the chat template) into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_byte_bpe()
    assert tok.get_vocab_size() == VOCAB_SIZE and tok.token_to_id("<s>") == BOS_ID
    tok.save(str(path / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "rstrip": False, "normalized": False,
                                  "single_word": False, "special": True}
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "added_tokens_decoder": added,
        "model_max_length": 1024,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def random_prompts(lengths: Sequence[int], seed: int = 0, vocab: int = BOS_ID) -> list[list[int]]:
    """Prompts of random ordinary token ids (below the special tokens), one per length."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def hf_greedy(
    path: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], device: str = "cpu"
) -> list[list[int]]:
    """transformers `generate(do_sample=False)`, one prompt at a time (no padding), EOS ignored.

    `max_new_tokens` is one count for every prompt, or one count per prompt."""
    import transformers

    counts = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    model.generation_config.eos_token_id = None
    out = []
    for prompt, n in zip(prompts, counts, strict=True):
        ids = torch.tensor([list(prompt)], device=device)
        # an explicit mask: without one, generate() takes every token equal to pad_token_id for padding
        ids = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
            do_sample=False, pad_token_id=0,
        )
        out.append(ids[0, len(prompt):].tolist())
    return out
