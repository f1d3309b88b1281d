"""Reading a PEFT adapter directory (model/lora_adapter.py): its factors are peft's, its scaling peft's, and
every directory that cannot be served on the base is refused by a message naming the adapter and the cause."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from flotilla_server.model.lora_adapter import LoraAdapterError, load_adapter
from flotilla_server.model.source import hf_config
from safetensors.torch import load_file, save_file

from tests.support.hf_models import make_hf_model_dir
from tests.support.lora_adapters import edit_adapter_config, make_lora_adapter, peft_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_hf_model_dir("llama", tmp_path_factory.mktemp("base") / "llama")


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory):
    return make_lora_adapter(base, tmp_path_factory.mktemp("lora") / "a", rank=8, seed=1)


@pytest.mark.parametrize(("rslora", "rank_pattern"), [(False, {}), (True, {}), (False, {"down_proj": 4})])
def test_the_factors_and_scaling_are_peft_s(base, tmp_path, rslora, rank_pattern):
    path = make_lora_adapter(base, tmp_path / "a", rank=8, alpha=12, seed=2, use_rslora=rslora,
                             rank_pattern=rank_pattern)
    adapter = load_adapter("a", str(path), hf_config(base))
    reference = peft_model(base, path)
    for layer in range(2):
        for module in ("q_proj", "v_proj", "gate_proj", "down_proj"):
            kind = "self_attn" if module in ("q_proj", "v_proj") else "mlp"
            lora = reference.base_model.model.model.layers[layer].__getattr__(kind).__getattr__(module)
            a, b = lora.lora_A["default"].weight, lora.lora_B["default"].weight
            scaling = lora.scaling["default"]
            ours = adapter.modules[(layer, module)]
            assert torch.equal(ours.a, a) and torch.allclose(ours.b, b * scaling)
            rank = rank_pattern.get(module, 8)
            assert ours.rank == rank
            assert scaling == pytest.approx(12 / math.sqrt(rank) if rslora else 12 / rank)
    assert adapter.max_rank == 8 and len(adapter.modules) == 2 * 7


def test_an_adapter_of_some_modules_and_layers_holds_only_those(base, tmp_path):
    path = make_lora_adapter(base, tmp_path / "a", rank=4, targets=("q_proj", "v_proj"), layers_to_transform=[1])
    adapter = load_adapter("a", str(path), hf_config(base))
    assert set(adapter.modules) == {(1, "q_proj"), (1, "v_proj")}
    assert adapter.nbytes(4) == 4 * sum(m.a.numel() + m.b.numel() for m in adapter.modules.values())


def copy_of(adapter, tmp_path):
    return shutil.copytree(adapter, tmp_path / "copy")


def bad_rank(path):
    weights = load_file(path / "adapter_model.safetensors")
    save_file({k: (v.repeat(9, 1) if "lora_A" in k else v.repeat(1, 9)) for k, v in weights.items()},
              path / "adapter_model.safetensors")
    edit_adapter_config(path, r=72)


def bad_module(path):
    weights = load_file(path / "adapter_model.safetensors")
    weights["base_model.model.model.layers.0.self_attn.rotary.lora_A.weight"] = torch.zeros(8, 64)
    save_file(weights, path / "adapter_model.safetensors")


@pytest.mark.parametrize(("spoil", "says"), [
    (lambda p: (p / "adapter_config.json").unlink(), "adapter_config.json not found: a PEFT adapter directory"),
    (lambda p: (p / "adapter_model.safetensors").unlink(), "adapter_model.safetensors not found"),
    (lambda p: edit_adapter_config(p, use_dora=True), "use_dora is true"),
    (lambda p: edit_adapter_config(p, modules_to_save=["lm_head"]), "modules_to_save ['lm_head']"),
    (lambda p: edit_adapter_config(p, target_modules=["q_proj", "embed_tokens"]), "target 'embed_tokens' adapts the head"),
    (lambda p: edit_adapter_config(p, bias="lora_only"), "bias 'lora_only' trains biases"),
    (lambda p: edit_adapter_config(p, peft_type="IA3"), "peft_type 'IA3' is not LORA"),
    (bad_rank, "rank 72 at layer 0 down_proj is over the cap of 64"),
    (bad_module, "targets a module that is not served: only each layer's q_proj"),
])
def test_an_adapter_that_cannot_be_served_is_refused_by_name(base, adapter, tmp_path, spoil, says):
    path = copy_of(adapter, tmp_path)
    spoil(path)
    with pytest.raises(LoraAdapterError, match=r"^LoRA adapter 'bad'") as refused:
        load_adapter("bad", str(path), hf_config(base))
    assert says in str(refused.value)


def test_an_adapter_for_another_base_is_refused_naming_both_shapes(adapter, tmp_path):
    wider = make_hf_model_dir("llama", tmp_path / "wider", hidden_size=128)
    with pytest.raises(LoraAdapterError, match=r"LoRA adapter 'a': layer 0 down_proj has factors A \[8, 128\] and "
                                               r"B \[64, 8\], but the base's down_proj is \[128, 128\] .*hidden size "
                                               r"128.*trained for another base model"):
        load_adapter("a", str(adapter), hf_config(wider))
    deeper = make_hf_model_dir("llama", tmp_path / "shallow", num_hidden_layers=1)
    with pytest.raises(LoraAdapterError, match=r"adapts layer 1 .* but the base has 1 layers"):
        load_adapter("a", str(adapter), hf_config(deeper))


def test_a_mixture_of_experts_base_serves_adapters_of_its_attention_and_dense_layers_only(tmp_path):
    """On a Qwen3-MoE base, peft's adapter of the experts (a wrapper over the stacked weights) is refused, and so
    is a factor of a sparse layer's MLP (from an adapter of a dense Qwen3 of the same shapes); its attention and
    its dense layer's MLP are served, and install_lora leaves the expert blocks as they are."""
    from flotilla_server.model import load_model
    from flotilla_server.model.lora_linear import LoraProjection, LoraSlots, install_lora
    from flotilla_server.model.moe import SparseMoeBlock

    moe_base = make_hf_model_dir("qwen3_moe", tmp_path / "moe")  # layer 1 dense, 0 and 2 sparse
    config = hf_config(moe_base)
    with pytest.raises(LoraAdapterError, match=r"layers\.0\.mlp\.experts\..* targets a module that is not served"):
        load_adapter("a", str(make_lora_adapter(moe_base, tmp_path / "experts", rank=4, seed=3)), config)
    dense_base = make_hf_model_dir("qwen3", tmp_path / "dense", num_hidden_layers=3)  # the same shapes, no experts
    path = make_lora_adapter(dense_base, tmp_path / "a", rank=4, seed=3)
    with pytest.raises(LoraAdapterError, match="adapts layer 0 down_proj, but that layer's MLP is a mixture of experts"):
        load_adapter("a", str(path), config)
    weights = load_file(path / "adapter_model.safetensors")
    save_file({k: v for k, v in weights.items() if "self_attn" in k or "layers.1.mlp" in k},
              path / "adapter_model.safetensors")
    adapter = load_adapter("a", str(path), config)
    assert {(layer, m) for layer, m in adapter.modules if m.endswith("_proj") and m[0] in "gud"} == {
        (1, "gate_proj"), (1, "up_proj"), (1, "down_proj")}

    model = load_model(str(moe_base), "float32", "cpu").model
    install_lora(model, LoraSlots(config, max_loras=1, max_rank=4, dtype=torch.float32))
    assert isinstance(model.layers[1].mlp.gate_up_proj, LoraProjection)
    assert isinstance(model.layers[0].mlp, SparseMoeBlock) and isinstance(model.layers[0].self_attn.qkv_proj,
                                                                          LoraProjection)
