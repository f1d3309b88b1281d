"""transformers' own MoE blocks (Qwen3-MoE, Mixtral) with random weights, and SparseMoeBlock twins loaded from
their state dicts: the references the MoE tests compare against.

The blocks run transformers' eager expert loop (`_experts_implementation = "eager"`), the semantics its other
implementations (grouped_mm, batched_mm) must also match.
"""

from __future__ import annotations

import torch
from flotilla_server.model.moe import SparseMoeBlock
from flotilla_server.model.moe_config import MoeConfig
from flotilla_server.model.moe_weights import load_hf_moe
from torch import nn
from transformers import MixtralConfig, PretrainedConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

HIDDEN, INTER, EXPERTS, TOP_K = 64, 32, 8, 2
# id -> (transformers block, its config with this test's shape)
KINDS = {
    "qwen3-norm-topk": (Qwen3MoeSparseMoeBlock, lambda: Qwen3MoeConfig(
        hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
        norm_topk_prob=True)),
    "qwen3-plain-topk": (Qwen3MoeSparseMoeBlock, lambda: Qwen3MoeConfig(
        hidden_size=HIDDEN, moe_intermediate_size=INTER, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
        norm_topk_prob=False)),
    "mixtral": (MixtralSparseMoeBlock, lambda: MixtralConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K)),
}


def reference_block(kind: str, seed: int = 0) -> tuple[nn.Module, PretrainedConfig]:
    """A transformers block of `kind` with N(0, 0.3) weights: wide enough that tokens spread over the experts."""
    block_class, make_config = KINDS[kind]
    config = make_config()
    config._experts_implementation = "eager"
    block = block_class(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():  # transformers leaves them empty (experts) or zero (router)
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return block.eval(), config


def twin(reference: nn.Module, config: PretrainedConfig) -> SparseMoeBlock:
    """SparseMoeBlock from the reference's config and state dict (transformers 5's stacked names)."""
    block = SparseMoeBlock(MoeConfig.from_hf(config.to_dict())).to(next(reference.parameters()).dtype)
    load_hf_moe(block, (("mlp." + name, t) for name, t in reference.state_dict().items()))
    return block.eval()


def run_reference(reference: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The transformers block on flat tokens [T, hidden] (it takes [batch, seq, hidden])."""
    return reference(x.unsqueeze(0))[0]


def assert_close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> None:
    """Equal within `rel` of the output's largest magnitude, element by element."""
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=rel, atol=rel * scale)
