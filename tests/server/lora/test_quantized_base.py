"""An adapter on a quantized GGUF base: the server's model holding the file's Q8_0 or Q4_1 blocks
(`--quantization gguf`, model/quant_linear.py) with a LoRA adapter in its slots gives, teacher-forced, next-token
distributions within the quantized-weights issue's bounds of peft's on the dequantized base (transformers'
own dequantization of the same file, saved as a Hugging Face directory, with the adapter applied by peft,
unmerged): mean KL at most 0.01 nats and top-1 agreement at least 98 %. In-process: through the model API the
engine drives (tests/server/lora/test_mixed_batch.py's one_step), and through the engine serving the file with
the adapter (EngineCore, quantization gguf, the server's --lora path), whose greedy tokens are peft's argmax
after the same prefix at the same rate. The adapter is checked to move the distributions, so the bounds are
not met by a no-op."""

from __future__ import annotations

import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import load_model
from flotilla_server.model.lora_adapter import load_adapter
from flotilla_server.model.lora_linear import BASE_SLOT, LoraSlots, install_lora
from flotilla_server.model.quant_linear import QuantizedLinear

from tests.server.lora.test_mixed_batch import one_step
from tests.server.model.gguf_files import LAYERS, T, write_llama_gguf
from tests.server.model.gguf_reference import load_reference
from tests.support.hf_models import random_prompts
from tests.support.lora_adapters import make_lora_adapter, peft_model

MAX_MEAN_KL, MIN_TOP1 = 0.01, 0.98  # the quantized-weights issue's bounds
RANK = 8
NEW_TOKENS = 8


def engine_greedy(path, adapter, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens of the engine serving the GGUF's blocks with the adapter, every prompt on the adapter."""
    engine = EngineCore(EngineConfig(model=str(path), quantization="gguf", loras=(("adapter", str(adapter)),),
                                     max_lora_rank=RANK, num_kv_blocks=32))
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        tokens[str(i)] = []
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True,
                                                          lora="adapter"))
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
    return [tokens[str(i)] for i in range(len(prompts))]


def kl_and_top1(reference: torch.Tensor, ours: torch.Tensor) -> tuple[float, float]:
    """Mean KL(reference || ours) in nats over positions, and the share of positions whose argmax agrees."""
    p, q = torch.log_softmax(reference.double(), -1), torch.log_softmax(ours.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    return kl.mean().item(), (reference.argmax(-1) == ours.argmax(-1)).double().mean().item()


@pytest.mark.parametrize("tensor_type", [T.Q8_0, T.Q4_1], ids=lambda t: t.name)
def test_an_adapter_on_gguf_blocks_is_within_the_bounds_of_peft_on_the_dequantized_base(tmp_path, tensor_type):
    path = write_llama_gguf(tmp_path / f"m-{tensor_type.name}.gguf", tensor_type, seed=4)
    dequantized = tmp_path / "dequantized"
    load_reference(path, num_layers=LAYERS).model.save_pretrained(dequantized)
    adapter = make_lora_adapter(dequantized, tmp_path / "adapter", rank=RANK, seed=9)
    loaded = load_model(str(path), "float32", "cpu", quantization="gguf")
    assert isinstance(loaded.model.layers[0].self_attn.qkv_proj, QuantizedLinear)  # the file's blocks, kept
    slots = LoraSlots(loaded.config, max_loras=1, max_rank=RANK, dtype=torch.float32)
    install_lora(loaded.model, slots)
    slots.load(0, load_adapter("adapter", str(adapter), loaded.config, RANK))
    prompts = random_prompts([12, 25, 40], seed=8, vocab=loaded.config.vocab_size)
    ours = torch.cat(one_step(loaded.model, prompts, slots, [0] * len(prompts)))
    reference_model = peft_model(dequantized, adapter)
    with torch.inference_mode():
        reference = torch.cat([reference_model(torch.tensor([p])).logits[0].float() for p in prompts])
    kl, top1 = kl_and_top1(reference, ours)
    assert kl <= MAX_MEAN_KL and top1 >= MIN_TOP1, (kl, top1)
    base = torch.cat(one_step(loaded.model, prompts, slots, [BASE_SLOT] * len(prompts)))
    moved_kl, moved_top1 = kl_and_top1(base, ours)
    assert moved_kl > 10 * MAX_MEAN_KL and moved_top1 < 0.9, (moved_kl, moved_top1)  # the adapter matters

    agree = total = 0
    for prompt, answer in zip(prompts, engine_greedy(path, adapter, prompts), strict=True):
        assert len(answer) == NEW_TOKENS
        with torch.inference_mode():  # teacher-forced on the engine's answer: peft's argmax after each prefix
            logits = reference_model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1:-1]
        agree += sum(a == b for a, b in zip(logits.argmax(-1).tolist(), answer, strict=True))
        total += NEW_TOKENS
    assert agree >= MIN_TOP1 * total, (agree, total)
