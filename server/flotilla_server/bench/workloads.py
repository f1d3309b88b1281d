"""The offline benchmark's models and request mixes, built in-process with no download.

`tiny` is the embedded demonstration model. `llama-100m` is a random Llama of about 100M parameters
(grouped-query attention, tiny's byte-level tokenizer). `smollm2` is the real model of `make run`, read from
the cache that `make model` fills (docs/models.md); the bench never downloads it. `to_transformers` copies a DecoderModel's
weights into the equivalent transformers model, so the `transformers` mode runs the same weights.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from flotilla_server.model import DecoderModel, LoadedModel, ModelConfig
from flotilla_server.model.loader import load_model, torch_dtype
from flotilla_server.model.tiny import TINY_CONFIG, build_tiny_model, build_tiny_tokenizer


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    output_len: int  # tokens generated, EOS ignored


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    model: str  # "tiny", "llama-100m", "llama-small" or "smollm2"
    num_requests: int
    min_len: int  # prompt and output lengths are each drawn uniformly from [min_len, max_len]
    max_len: int
    max_num_seqs: int = 64
    static_batch: int = 64
    sequential_stride: int = 4  # sequential mode runs every Nth request: a rate, sampled to fit the time budget
    transformers_batch: int | None = None  # transformers' static batch; None: static_batch
    transformers_batches: int | None = None  # batches run through transformers; None: every batch


WORKLOADS = {
    "tiny": Workload("tiny", "tiny (demonstration model), 256 requests, lengths 8-512", "tiny", 256, 8, 512,
                     transformers_batches=2),
    "llama-100m": Workload("llama-100m", "random Llama ~100M parameters, 64 requests, lengths 8-256",
                           "llama-100m", 64, 8, 256, sequential_stride=8, transformers_batch=32,
                           transformers_batches=1),
    "smollm2": Workload("smollm2", "SmolLM2-135M-Instruct (make run's model), 64 requests, lengths 8-256",
                        "smollm2", 64, 8, 256, sequential_stride=8, transformers_batch=32,
                        transformers_batches=1),
}
QUICK_WORKLOADS = {
    "tiny": Workload("tiny", "tiny, 12 requests, lengths 8-40 (--quick)", "tiny", 12, 8, 40,
                     max_num_seqs=4, static_batch=4, sequential_stride=3, transformers_batches=1),
    "llama-small": Workload("llama-small", "random small Llama, 6 requests, lengths 8-24 (--quick)",
                            "llama-small", 6, 8, 24, max_num_seqs=4, static_batch=3, sequential_stride=2,
                            transformers_batches=1),
}

LLAMA_100M = ModelConfig(
    model_type="llama", vocab_size=TINY_CONFIG.vocab_size, hidden_size=768, intermediate_size=2048,
    num_layers=16, num_heads=12, num_kv_heads=4, head_dim=64, max_position_embeddings=1024,
    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
    bos_token_id=TINY_CONFIG.bos_token_id, eos_token_ids=TINY_CONFIG.eos_token_ids,
)
LLAMA_SMALL = ModelConfig(
    model_type="llama", vocab_size=TINY_CONFIG.vocab_size, hidden_size=64, intermediate_size=128,
    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256,
    tie_word_embeddings=True, bos_token_id=TINY_CONFIG.bos_token_id, eos_token_ids=TINY_CONFIG.eos_token_ids,
)


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """Where `make model` (scripts/fetch_smollm2.py) keeps the GGUF: $FLOTILLA_CACHE_DIR/models."""
    root = os.environ.get("FLOTILLA_CACHE_DIR") or Path.home() / ".cache" / "flotilla"
    return Path(root) / "models" / SMOLLM2_FILE


def build_model(name: str, seed: int = 0, device: str = "cpu", dtype: str = "float32",
                quantization: str | None = None) -> LoadedModel:
    """`quantization` applies to smollm2 (its GGUF; None: the server's default, its blocks kept)."""
    if name == "smollm2":
        path = smollm2_path()
        if not path.is_file():
            raise SystemExit(f"flotilla-bench: {path} is missing; `make model` fetches it once")
        return load_model(str(path), device=device, dtype=dtype, quantization=quantization)
    if name == "tiny":
        model = build_tiny_model()
        config = TINY_CONFIG
    else:
        config = {"llama-100m": LLAMA_100M, "llama-small": LLAMA_SMALL}[name]
        model = DecoderModel(config)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                p.copy_(torch.ones(p.shape) if pname.endswith("norm.weight") else torch.randn(p.shape, generator=gen) * 0.02)
        model.eval()
    model = model.to(device=device, dtype=torch_dtype(dtype))
    return LoadedModel(model, build_tiny_tokenizer(), config, name, f"{name}: random weights, for benchmarks")


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def make_requests(workload: Workload, vocab_size: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    low, high = workload.min_len, workload.max_len
    return [
        Request([rng.randrange(vocab_size - 4) for _ in range(rng.randint(low, high))], rng.randint(low, high))
        for _ in range(workload.num_requests)
    ]


def to_transformers(loaded: LoadedModel):
    """The same weights in `transformers.LlamaForCausalLM` (fused projections split back)."""
    import transformers

    c = loaded.config
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings, bos_token_id=c.bos_token_id,
        eos_token_id=None, pad_token_id=0,
    )
    q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    state = {}
    for name, tensor in loaded.model.state_dict().items():
        tensor = tensor.cpu()
        if ".qkv_proj." in name:
            for part, t in zip(("q_proj", "k_proj", "v_proj"), tensor.split((q_size, kv_size, kv_size)), strict=True):
                state["model." + name.replace("qkv_proj", part)] = t
        elif ".gate_up_proj." in name:
            for part, t in zip(("gate_proj", "up_proj"), tensor.chunk(2), strict=True):
                state["model." + name.replace("gate_up_proj", part)] = t
        else:
            state["model." + name] = tensor
    hf = transformers.LlamaForCausalLM(hf_config).to(next(loaded.model.parameters()).dtype)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and c.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping to transformers failed: missing {missing}, unexpected {unexpected}")
    if c.tie_word_embeddings:
        hf.tie_weights()
    hf.generation_config.eos_token_id = None
    return hf.eval()
