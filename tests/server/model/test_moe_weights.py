"""MoE weights from every spelling that reaches a loader: transformers 5.23's save_pretrained (per-expert hub
names by default, stacked ones with save_original_format=False), GGUF's 3-D expert tensors (F32 and Q8_0),
and the config read from config.json and GGUF metadata."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flotilla_server.model.config import UnsupportedModelError
from flotilla_server.model.gguf_file import GGUFFile
from flotilla_server.model.moe import SparseMoeBlock
from flotilla_server.model.moe_config import MoeConfig
from flotilla_server.model.moe_weights import (
    ExpertTarget,
    gguf_moe_target,
    hf_moe_target,
    load_gguf_moe,
    load_hf_moe,
)
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.modeling_gguf_pytorch_utils import Qwen2MoeTensorProcessor

from tests.server.model.moe_reference import EXPERTS, HIDDEN, INTER, TOP_K, assert_close, reference_block

SMALL = {"vocab_size": 32, "hidden_size": HIDDEN, "num_hidden_layers": 1, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_experts_per_tok": TOP_K}
MODELS = {
    "qwen3_moe": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **SMALL, head_dim=16, intermediate_size=48, moe_intermediate_size=INTER, num_experts=EXPERTS,
        norm_topk_prob=True)),
    "mixtral": lambda: MixtralForCausalLM(MixtralConfig(**SMALL, intermediate_size=INTER, num_local_experts=EXPERTS)),
}
# what 5.23's save_pretrained writes for layer 0's expert 0 and router (default: the hub's own names)
SAVED_NAMES = {
    ("qwen3_moe", True): {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.0.gate_proj.weight",
                          "model.layers.0.mlp.experts.0.up_proj.weight", "model.layers.0.mlp.experts.0.down_proj.weight"},
    ("mixtral", True): {"model.layers.0.block_sparse_moe.gate.weight",
                        "model.layers.0.block_sparse_moe.experts.0.w1.weight",
                        "model.layers.0.block_sparse_moe.experts.0.w3.weight",
                        "model.layers.0.block_sparse_moe.experts.0.w2.weight"},
    ("qwen3_moe", False): {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
                           "model.layers.0.mlp.experts.down_proj"},
    ("mixtral", False): {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
                         "model.layers.0.mlp.experts.down_proj"},
}


@pytest.mark.parametrize("original_format", [True, False], ids=["hub-names", "stacked-names"])
@pytest.mark.parametrize("model_type", MODELS)
def test_save_pretrained_checkpoints_load(tmp_path: Path, model_type: str, original_format: bool) -> None:
    torch.manual_seed(0)
    model = MODELS[model_type]().eval()
    model.set_experts_implementation("eager")
    with torch.no_grad():  # the router starts at zero in some inits: every token would pick experts 0 and 1
        model.model.layers[0].mlp.gate.weight.normal_(0, 0.3)
    model.save_pretrained(tmp_path, save_original_format=original_format)
    saved = load_file(tmp_path / "model.safetensors")
    found = {name: hf_moe_target(name) for name in saved}
    moe = {name: t for name, t in saved.items() if found[name] is not None}
    assert SAVED_NAMES[model_type, original_format] <= set(moe)
    assert len(moe) == (1 + 3 * EXPERTS if original_format else 3)
    assert not any("experts" in name or ".gate." in name for name in set(saved) - set(moe))  # none overlooked
    assert {found[name][0] for name in moe} == {0}

    block = SparseMoeBlock(MoeConfig.from_hf(model.config.to_dict()))
    load_hf_moe(block, moe.items())
    x = torch.randn(40, HIDDEN)
    with torch.no_grad():
        assert_close(block(x), model.model.layers[0].mlp(x[None])[0])


@pytest.mark.parametrize(("name", "expected"), [
    ("model.layers.3.mlp.experts.7.up_proj.weight", (3, ExpertTarget("up", 7))),
    ("model.layers.0.block_sparse_moe.experts.1.w1.weight", (0, ExpertTarget("gate", 1))),
    ("model.layers.0.block_sparse_moe.experts.1.w2.weight", (0, ExpertTarget("down", 1))),
    ("model.layers.0.block_sparse_moe.experts.1.w3.weight", (0, ExpertTarget("up", 1))),
    ("model.layers.12.mlp.experts.gate_up_proj", (12, ExpertTarget("gate_up"))),
    ("mlp.gate.weight", (None, ExpertTarget("router"))),
    ("model.layers.0.mlp.gate_proj.weight", None),  # a dense layer's MLP (Qwen3-MoE's mlp_only_layers)
    ("model.layers.0.mlp.shared_expert.gate_proj.weight", None),  # Qwen2-MoE's, not a routed expert
    ("model.layers.0.self_attn.q_proj.weight", None),
])
def test_hf_names(name: str, expected: tuple[int | None, ExpertTarget] | None) -> None:
    assert hf_moe_target(name) == expected


def test_gguf_names() -> None:
    assert gguf_moe_target("blk.5.ffn_gate_inp.weight") == (5, ExpertTarget("router"))
    assert gguf_moe_target("blk.5.ffn_down_exps.weight") == (5, ExpertTarget("down"))
    assert gguf_moe_target("blk.5.ffn_gate.weight") is None
    assert gguf_moe_target("blk.5.ffn_gate_inp_shexp.weight") is None


def test_missing_misshapen_and_foreign_weights_are_named() -> None:
    reference, config = reference_block("mixtral")
    block = SparseMoeBlock(MoeConfig.from_hf(config.to_dict()))
    state = {"mlp." + name: t for name, t in reference.state_dict().items()}
    with pytest.raises(ValueError, match="missing MoE weights: router"):
        load_hf_moe(block, [(n, t) for n, t in state.items() if "gate.weight" not in n])
    per_expert = [(f"block_sparse_moe.experts.{e}.{w}.weight", torch.zeros(INTER, HIDDEN))
                  for e in range(EXPERTS) for w in ("w1", "w3")]
    with pytest.raises(ValueError, match=r"expert 0 down, expert 1 down"):
        load_hf_moe(block, [("block_sparse_moe.gate.weight", torch.zeros(EXPERTS, HIDDEN)), *per_expert])
    with pytest.raises(ValueError, match=r"'mlp.experts.down_proj' has shape \(8, 32, 64\), the config implies"):
        load_hf_moe(block, [("mlp.experts.down_proj", state["mlp.experts.down_proj"].transpose(1, 2))])
    with pytest.raises(ValueError, match="for expert 8, but the config has 8 experts"):
        load_hf_moe(block, [("mlp.experts.8.down_proj.weight", torch.zeros(HIDDEN, INTER))])
    with pytest.raises(ValueError, match=r"unexpected weight 'mlp\.gate_proj\.weight'"):
        load_hf_moe(block, [("mlp.gate_proj.weight", torch.zeros(INTER, HIDDEN))])


def write_moe_gguf(path: Path, reference: torch.nn.Module, qtype: GGMLQuantizationType) -> dict[str, np.ndarray]:
    """Layer 0 of a qwen3moe GGUF, written as llama.cpp's converter does: each expert's [rows, columns] stacked
    along a first dimension of E. Returns the float arrays written, by name."""
    gate_up = reference.experts.gate_up_proj.detach().numpy()
    arrays = {"blk.0.ffn_gate_inp.weight": reference.gate.weight.detach().numpy(),
              "blk.0.ffn_gate_exps.weight": gate_up[:, :INTER], "blk.0.ffn_up_exps.weight": gate_up[:, INTER:],
              "blk.0.ffn_down_exps.weight": reference.experts.down_proj.detach().numpy()}
    w = GGUFWriter(str(path), "qwen3moe")
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(3 * INTER)  # the dense layers' width: not the experts'
    w.add_expert_feed_forward_length(INTER)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    for name, array in arrays.items():
        array = np.ascontiguousarray(array, dtype=np.float32)
        if qtype == GGMLQuantizationType.F32 or "gate_inp" in name:  # llama.cpp keeps the router float
            w.add_tensor(name, array)
        else:
            w.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0], ids=lambda t: t.name)
def test_gguf_expert_tensors_load(tmp_path: Path, qtype: GGMLQuantizationType) -> None:
    reference, config = reference_block("qwen3-norm-topk")
    write_moe_gguf(tmp_path / "moe.gguf", reference, qtype)
    gg = GGUFFile(tmp_path / "moe.gguf")
    assert {t.name: t.shape for t in gg.tensors}["blk.0.ffn_down_exps.weight"] == (EXPERTS, HIDDEN, INTER)
    cfg = MoeConfig.from_gguf("qwen3moe", gg.fields)
    assert cfg == MoeConfig.from_hf(config.to_dict())
    block = SparseMoeBlock(cfg)
    load_gguf_moe(block, gg.tensors)

    # the layout transformers' own GGUF reader builds from the same dequantized tensors
    processor, parsed = Qwen2MoeTensorProcessor(), {"tensors": {}}
    names = {f"blk.0.ffn_{w}_exps": f"experts.{'down' if w == 'down' else 'gate_up'}_proj" for w in ("gate", "up", "down")}
    for t in gg.tensors:
        if "exps" in t.name:
            processor.process(dequantize(t.data, GGMLQuantizationType(t.type_id)), t.name,
                              tensor_key_mapping=names, parsed_parameters=parsed)
    assert torch.equal(block.experts.gate_up_proj, parsed["tensors"]["experts.gate_up_proj"])
    assert torch.equal(block.experts.down_proj, parsed["tensors"]["experts.down_proj"])

    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = reference(x[None])[0]
        assert_close(block(x), want, rel=1e-5 if qtype == GGMLQuantizationType.F32 else 3e-2)


def test_config_from_hf_reads_both_spellings_of_the_expert_count() -> None:
    hub = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_experts": 128, "num_experts_per_tok": 8,
           "moe_intermediate_size": 768, "intermediate_size": 6144, "norm_topk_prob": True,
           "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    cfg = MoeConfig.from_hf(hub)
    assert (cfg.num_experts, cfg.expert_intermediate_size, cfg.norm_topk_prob) == (128, 768, True)
    assert not cfg.float32_scaling
    assert [cfg.is_sparse(i) for i in range(6)] == [False, True, False, False, False, True]
    written_by_v5 = {**{k: v for k, v in hub.items() if k != "num_experts"}, "num_local_experts": 128}
    assert MoeConfig.from_hf(written_by_v5) == cfg
    mixtral = MoeConfig.from_hf(MixtralConfig().to_dict())
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.expert_intermediate_size) == (8, 2, 14336)
    assert mixtral.norm_topk_prob and mixtral.float32_scaling
    with pytest.raises(UnsupportedModelError, match="choose a qwen3_moe or mixtral model"):
        MoeConfig.from_hf({"model_type": "qwen2_moe"})
    with pytest.raises(UnsupportedModelError, match="num_experts_per_tok \\(9\\) must be at most"):
        MoeConfig.from_hf({**hub, "num_experts": 8, "num_experts_per_tok": 9})


def test_config_from_gguf_metadata() -> None:
    mixtral = {"llama.embedding_length": 4096, "llama.feed_forward_length": 14336, "llama.expert_count": 8,
               "llama.expert_used_count": 2}
    assert MoeConfig.from_gguf("llama", mixtral) == MoeConfig(4096, 8, 2, 14336, True, float32_scaling=True)
    assert MoeConfig.from_gguf("llama", {"llama.embedding_length": 4096}) is None  # a dense llama
    assert MoeConfig.from_gguf("qwen3", {"qwen3.expert_count": 8}) is None
    with pytest.raises(UnsupportedModelError, match=r"no qwen3moe\.expert_feed_forward_length"):
        MoeConfig.from_gguf("qwen3moe", {"qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2,
                                         "qwen3moe.feed_forward_length": 6144})
    with pytest.raises(UnsupportedModelError, match="by softmax only"):
        MoeConfig.from_gguf("llama", {**mixtral, "llama.expert_gating_func": 2})
