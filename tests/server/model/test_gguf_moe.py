"""Mixture-of-experts GGUF files: qwen3moe (Qwen3-MoE) and llama with experts (Mixtral, as llama.cpp converts it),
their router `ffn_gate_inp` and 3-D `ffn_{gate,up,down}_exps` tensors, float and Q8_0, held as blocks
(`--quantization gguf`) or dequantized (`none`).

References: transformers' own GGUF loader for qwen3moe (it maps qwen3_moe, stacking the experts as its
Qwen2MoeTensorProcessor does, but reads no expert width: the test gives it); for Mixtral, whose `llama` files
transformers reads as a dense Llama, transformers on the Hugging Face directory the file is written from.
Memory: the footprint from the file's index is what the loaded model holds. Refusals: a GGUF architecture with
shared experts (qwen2moe), and int8 for a mixture of experts, each in one line, exit 2 from the CLI.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flotilla_server.model import UnsupportedModelError, load_model
from flotilla_server.model.moe import SparseMoeBlock
from flotilla_server.model.quant_experts import QuantizedExperts
from flotilla_server.model.source import check_fp8, gguf_tensors, source_config
from flotilla_server.model_cache.footprint import gguf_weight_bytes
from safetensors.numpy import load_file

from tests.support.hf_models import make_hf_model_dir

from .gguf_reference import load_reference
from .test_gguf_qwen import LAYERS, T, assert_cli_refuses, assert_greedy_equals, write_decoder_gguf
from .test_gguf_rope import llama_cpp_permute

EXPERTS, TOP_K, WIDTH = 8, 2, 64
HEADS, KV_HEADS = 4, 2
QWEN3MOE = {"hidden": 128, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": 32, "qk_norm": True,
            "experts": (EXPERTS, TOP_K, WIDTH)}
# what make_hf_model_dir must match in the GGUF writer's fixed fields
WRITER_FIELDS = {"rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def check_loaded(path: Path, kept: bool) -> None:
    """Every sparse layer holds its experts as blocks where `kept`, as float stacks where not, and the footprint
    from the file's index is what the model holds."""
    loaded = load_model(str(path), "float32", "cpu")
    blocks = [layer.mlp for layer in loaded.model.layers if isinstance(layer.mlp, SparseMoeBlock)]
    assert blocks and all(isinstance(b.experts, QuantizedExperts) == kept for b in blocks)
    assert gguf_weight_bytes(loaded.config, gguf_tensors(str(path)), "float32", "cpu") == loaded.model.weight_bytes()


@pytest.mark.parametrize("tensor_type", [T.F32, T.Q8_0], ids=lambda t: t.name)
def test_qwen3moe_equals_transformers_gguf_loader(tmp_path: Path, tensor_type: T) -> None:
    path = write_decoder_gguf(tmp_path / f"qwen3moe.{tensor_type.name}.gguf", "qwen3moe", tensor_type, **QWEN3MOE)
    config = load_model(str(path), "float32", "cpu").config
    assert config.model_type == "qwen3moe" and config.qk_norm and config.moe.norm_topk_prob
    assert (config.moe.num_experts, config.moe.num_experts_per_tok, config.moe.expert_intermediate_size) == (
        EXPERTS, TOP_K, WIDTH)
    assert all(config.is_sparse(i) for i in range(LAYERS))
    check_loaded(path, kept=tensor_type == T.Q8_0)
    reference = load_reference(path, LAYERS, "qwen3_moe", moe_intermediate_size=WIDTH).model
    if tensor_type == T.Q8_0:  # the blocks' products, then the same file dequantized
        assert_greedy_equals(path, reference, "gguf")
    assert_greedy_equals(path, reference, "none")


def test_experts_of_a_type_without_a_kernel_are_dequantized_all_three(tmp_path: Path) -> None:
    path = write_decoder_gguf(tmp_path / "m.gguf", "qwen3moe", T.Q8_0, tensor_types={"ffn_down_exps": T.F16},
                              **QWEN3MOE)
    check_loaded(path, kept=False)
    assert load_model(str(path), "float32", "cpu").model.quantization() == "gguf:Q8_0"  # the attention's blocks
    reference = load_reference(path, LAYERS, "qwen3_moe", moe_intermediate_size=WIDTH).model
    assert_greedy_equals(path, reference, "gguf")


def gguf_from_moe_dir(directory: Path, path: Path, arch: str, tensor_type: T = T.F32) -> Path:
    """The directory's weights as llama.cpp's converter writes them: experts stacked into 3-D tensors, the router
    as ffn_gate_inp, Q and K rows permuted in a `llama` (Mixtral) file, a dense layer's MLP as it is."""
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "mlp.gate": "ffn_gate_inp", "block_sparse_moe.gate": "ffn_gate_inp"}
    experts = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
               "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}
    tensors, stacks = {}, {}
    for name, weights in load_file(directory / "model.safetensors").items():
        name = name.removeprefix("model.")
        if not name.startswith("layers."):
            tensors[{"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]] = weights
            continue
        _, layer, *part, kind = name.split(".")
        if "experts" in part:  # (mlp | block_sparse_moe).experts.E.PART
            stacks.setdefault(f"blk.{layer}.{experts[part[-1]]}.{kind}", {})[int(part[-2])] = weights
            continue
        if arch == "llama" and part[-1] in ("q_proj", "k_proj"):
            weights = llama_cpp_permute(weights, HEADS if part[-1] == "q_proj" else KV_HEADS)
        tensors[f"blk.{layer}.{names['.'.join(part)]}.{kind}"] = weights
    for name, by_expert in stacks.items():
        tensors[name] = np.stack([by_expert[e] for e in sorted(by_expert)])
    vocab, hidden = tensors["token_embd.weight"].shape
    count, width, _ = tensors["blk.0.ffn_gate_exps.weight"].shape
    dense = tuple(int(n.split(".")[1]) for n in tensors if n.endswith("ffn_gate.weight"))
    dense_width = tensors[f"blk.{dense[0]}.ffn_gate.weight"].shape[0] if dense else width
    return write_decoder_gguf(path, arch, tensor_type, hidden=hidden, ffn=dense_width, heads=HEADS, kv_heads=KV_HEADS,
                              head_dim=tensors["blk.0.attn_q.weight"].shape[0] // HEADS, tensors=tensors,
                              vocab_size=vocab, qk_norm="blk.0.attn_q_norm.weight" in tensors,
                              experts=(count, TOP_K, width), dense_layers=dense, layers=1 + max(
                                  int(n.split(".")[1]) for n in tensors if n.startswith("blk.")))


@pytest.mark.parametrize(("arch", "hf_arch", "tensor_type"), [
    ("llama", "mixtral", T.F32), ("llama", "mixtral", T.Q8_0), ("qwen3moe", "qwen3_moe", T.F32),
], ids=["mixtral-F32", "mixtral-Q8_0", "qwen3moe-dense-layer-F32"])
def test_a_file_written_from_a_directory_equals_transformers_on_it(tmp_path: Path, arch: str, hf_arch: str,
                                                                   tensor_type: T) -> None:
    import transformers

    directory = make_hf_model_dir(hf_arch, tmp_path / "hf", **WRITER_FIELDS)
    path = gguf_from_moe_dir(directory, tmp_path / f"m.{tensor_type.name}.gguf", arch, tensor_type)
    config, hf_config = load_model(str(path), "float32", "cpu").config, load_model(str(directory), "float32", "cpu").config
    assert config.moe == hf_config.moe and config.moe.float32_scaling == (arch == "llama")
    assert [config.is_sparse(i) for i in range(config.num_layers)] == [hf_config.is_sparse(i)
                                                                        for i in range(hf_config.num_layers)]
    check_loaded(path, kept=tensor_type == T.Q8_0)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert_greedy_equals(path, reference, "gguf")


def test_shared_experts_are_refused_by_architecture(tmp_path: Path) -> None:
    path = write_decoder_gguf(tmp_path / "m.gguf", "qwen2moe", experts=(4, 2, 64), hidden=64)
    message = ("GGUF architecture 'qwen2moe' is not supported: Flotilla loads GGUF files of architecture llama, "
               "qwen2, qwen3, gemma3, phi3, qwen3moe")
    with pytest.raises(UnsupportedModelError, match=message):
        load_model(str(path))
    assert_cli_refuses(path, message)


def test_int8_and_fp8_refuse_a_mixture_of_experts_in_one_line(tmp_path: Path) -> None:
    path = write_decoder_gguf(tmp_path / "m.gguf", "qwen3moe", **{**QWEN3MOE, "hidden": 64})
    message = ("quantization int8 does not quantize the experts of a mixture-of-experts model (qwen3moe: 8 experts a "
               "sparse layer): pass --quantization none, or gguf with a .gguf file, which keeps expert blocks")
    with pytest.raises(ValueError, match=r"quantization int8 does not quantize the experts"):
        load_model(str(path), quantization="int8")
    assert_cli_refuses(path, message, "--quantization", "int8")
    with pytest.raises(ValueError, match=r"quantization fp8 does not quantize the experts .*qwen3moe: 8 experts"):
        check_fp8(source_config(str(path)), "cuda")  # before the device's own checks
