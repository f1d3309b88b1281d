"""LoRA adapters on a checkpoint's fused projections (Phi-3's qkv_proj and gate_up_proj, as peft trains them on
Phi3ForCausalLM): greedy tokens equal peft's through the engine, alone and beside an adapter on the unfused
modules of the same layers; an adapter naming a fused module and its parts in one layer is refused."""

from __future__ import annotations

import pytest
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import load_model
from flotilla_server.model.lora_adapter import LoraAdapterError, load_adapter
from safetensors.torch import load_file, save_file

from tests.support.hf_models import hf_greedy, make_hf_model_dir, random_prompts
from tests.support.lora_adapters import make_lora_adapter

from .test_engine_equality import peft_greedy

PROMPTS = random_prompts([6, 19, 33], seed=5)
NEW_TOKENS = 8
FUSED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-phi3")
    base = make_hf_model_dir("phi3", root / "base", partial_rotary_factor=0.5)
    fused = make_lora_adapter(base, root / "fused", rank=8, seed=1, targets=FUSED)
    attn_only = make_lora_adapter(base, root / "qkv", rank=4, seed=2, targets=("qkv_proj",))
    expected = {None: hf_greedy(base, PROMPTS, NEW_TOKENS)}
    for name, path in (("fused", fused), ("qkv", attn_only)):
        expected[name] = peft_greedy(base, path, PROMPTS, NEW_TOKENS)
    return base, {"fused": fused, "qkv": attn_only}, expected


def test_fused_adapters_answer_as_peft_in_one_mixed_batch(phi3):
    base, adapters, expected = phi3
    loaded = load_model(str(base), "float32", "cpu")
    engine = EngineCore(EngineConfig(model="unused", loras=tuple((n, str(p)) for n, p in adapters.items()),
                                     max_lora_rank=8, num_kv_blocks=64, prefill_chunk=8), loaded=loaded)
    tokens: dict[tuple[str | None, int], list[int]] = {}
    for name in (None, *adapters):
        for i, prompt in enumerate(PROMPTS):
            tokens[(name, i)] = []
            engine.add_request(f"{name}-{i}", prompt, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                                                                     ignore_eos=True, lora=name))
    while engine.has_unfinished():
        for out in engine.step():
            name, i = out.request_id.rsplit("-", 1)
            tokens[(None if name == "None" else name, int(i))] += out.token_ids
    for (name, i), got in tokens.items():
        assert got == expected[name][i], (name, i)
    assert sum(expected["fused"][i] != expected[None][i] for i in range(len(PROMPTS))) >= 2  # it moves tokens


def test_a_fused_module_and_its_parts_in_one_layer_are_refused(phi3, tmp_path):
    base = phi3[0]
    mixed = make_lora_adapter(base, tmp_path / "mixed", rank=4, seed=3, targets=("qkv_proj",))
    config = load_model(str(base), "float32", "cpu").config
    weights = load_file(str(mixed / "adapter_model.safetensors"))
    key = next(k for k in weights if "layers.0.self_attn.qkv_proj.lora_A" in k)
    q_rows = config.num_heads * config.head_dim
    weights[key.replace("qkv_proj", "q_proj")] = weights[key].clone()
    weights[key.replace("qkv_proj", "q_proj").replace("lora_A", "lora_B")] = \
        weights[key.replace("lora_A", "lora_B")][:q_rows].clone()
    save_file(weights, str(mixed / "adapter_model.safetensors"))
    with pytest.raises(LoraAdapterError, match=r"layer 0 adapts qkv_proj and its parts \(q_proj\) both: train one"):
        load_adapter("mixed", str(mixed), config)
