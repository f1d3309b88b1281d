"""Adapters in one mixed batch (model/lora_linear.py): one forward pass over prompts of three adapters (ranks
4, 8 and 16) and of the base gives each prompt peft's logits for its adapter (peft on transformers, unmerged),
on two architectures; the adapters move the logits; a row's result does not depend on the others' adapters."""

from __future__ import annotations

import pytest
import torch
from flotilla_server.model import AttentionBatch, KVCacheTensors, load_model
from flotilla_server.model.lora_adapter import load_adapter, part_sizes
from flotilla_server.model.lora_linear import BASE_SLOT, LoraSlots, install_lora

from tests.support.hf_models import make_hf_model_dir
from tests.support.lora_adapters import make_lora_adapter, peft_model

RANKS = (4, 8, 16)
BLOCK = 16


def one_step(model, prompts: list[list[int]], slots: LoraSlots, slot_of: list[int]) -> list[torch.Tensor]:
    """Every prompt prefilled in one step, each in its own blocks; returns each prompt's logits [len, vocab]."""
    cfg = model.config
    tables, next_block = [], 0
    for p in prompts:
        n = -(-len(p) // BLOCK)
        tables.append(list(range(next_block, next_block + n)))
        next_block += n
    kv = KVCacheTensors.allocate(cfg.num_layers, next_block, BLOCK, cfg.num_kv_heads, cfg.head_dim,
                                 model.compute_dtype, torch.device("cpu"))
    lens = [len(p) for p in prompts]
    batch = AttentionBatch.build(lens, lens, tables, BLOCK, torch.device("cpu"))
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(n) for n in lens])
    slots.set_rows(torch.tensor([s for s, n in zip(slot_of, lens, strict=True) for _ in range(n)]))
    with torch.inference_mode():
        logits = model.compute_logits(model(ids, positions, batch, kv))
    slots.set_rows(None)
    return list(logits.split(lens))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def served(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    base = make_hf_model_dir(request.param, root / "base")
    paths = [make_lora_adapter(base, root / f"r{rank}", rank=rank, seed=rank) for rank in RANKS]
    loaded = load_model(str(base), "float32", "cpu")
    slots = LoraSlots(loaded.config, max_loras=4, max_rank=max(RANKS), dtype=torch.float32)
    install_lora(loaded.model, slots)
    for slot, path in enumerate(paths):
        slots.load(slot, load_adapter(f"r{RANKS[slot]}", str(path), loaded.config))
    return base, paths, loaded, slots


def reference_logits(base, adapter, prompt: list[int]) -> torch.Tensor:
    model = peft_model(base, adapter) if adapter is not None else None
    if model is None:
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0].float()


def test_a_mixed_batch_gives_each_prompt_peft_s_logits_for_its_adapter(served):
    base, paths, loaded, slots = served
    prompts = [[380, *range(3 + 7 * i, 30 + 9 * i)] for i in range(5)]
    slot_of = [0, BASE_SLOT, 1, 2, 0]  # adapters r4, base, r8, r16, r4 again
    ours = one_step(loaded.model, prompts, slots, slot_of)
    for prompt, slot, got in zip(prompts, slot_of, ours, strict=True):
        expected = reference_logits(base, None if slot == BASE_SLOT else paths[slot], prompt)
        assert torch.allclose(got, expected, atol=2e-4, rtol=1e-4), (slot, (got - expected).abs().max())
    base_logits = ours[1]
    for slot in range(3):  # each adapter moves the model: its top tokens differ from the base's on most positions
        alone = one_step(loaded.model, [prompts[1]], slots, [slot])[0]
        differs = (alone.argmax(-1) != base_logits.argmax(-1)).float().mean().item()
        assert differs >= 0.5, (RANKS[slot], differs)


def test_a_row_s_result_does_not_depend_on_the_other_rows_adapters(served):
    _, _, loaded, slots = served
    prompt = [380, *range(40, 70)]
    alone = one_step(loaded.model, [prompt], slots, [1])[0]
    crowded = one_step(loaded.model, [[380, *range(5, 25)], prompt, [380, 7, 8, 9]], slots, [0, 1, 2])[1]
    assert torch.allclose(alone, crowded, atol=1e-5, rtol=0)


def test_a_cleared_slot_serves_the_base_and_the_slots_cost_what_they_hold(served):
    _, _, loaded, slots = served
    prompt = [380, *range(50, 64)]
    base_alone = one_step(loaded.model, [prompt], slots, [BASE_SLOT])[0]
    slots.clear(3)  # never loaded: zeros
    assert torch.equal(one_step(loaded.model, [prompt], slots, [3])[0], base_alone)
    sizes = part_sizes(loaded.config)  # every slot holds A [rank, in] and B [out, rank] of every module
    expected = 4 * slots.max_loras * slots.max_rank * loaded.config.num_layers * sum(o + i for o, i in sizes.values())
    assert slots.nbytes() == expected
