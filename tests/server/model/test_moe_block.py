"""SparseMoeBlock against transformers 5.23's Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock: routing, the
per-expert grouping, the dtype rules, idle experts and lone tokens, and memory accounting."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from flotilla_server.model.linear import packs
from flotilla_server.model.moe import SparseMoeBlock, group_by_expert, route
from flotilla_server.model.moe_config import MoeConfig
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.server.model.moe_reference import (
    EXPERTS,
    HIDDEN,
    INTER,
    KINDS,
    TOP_K,
    assert_close,
    reference_block,
    run_reference,
    twin,
)


def experts_hit(block: SparseMoeBlock, x: torch.Tensor) -> tuple[int, ...]:
    cfg = block.config
    weights, expert_ids = route(block.router(x), cfg.num_experts_per_tok, cfg.norm_topk_prob, cfg.float32_scaling)
    return group_by_expert(expert_ids, weights, cfg.num_experts).experts_hit


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "grad"])
def test_float32_matches_transformers(kind: str, grad: bool) -> None:
    """Grad disabled takes the runtime's paths (packed router, native silu_mul); grad enabled, torch's alone."""
    reference, config = reference_block(kind)
    block = twin(reference, config)
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.set_grad_enabled(grad):
        got, want = block(x), run_reference(reference, x)
    assert got.shape == (40, HIDDEN)
    assert len(experts_hit(block, x)) >= 6  # the batch exercises the grouping, not one or two experts
    assert_close(got, want)


@pytest.mark.parametrize("kind", ["qwen3-norm-topk", "mixtral"])
def test_bfloat16_matches_transformers_bit_for_bit(kind: str) -> None:
    """The weights' dtype rule (Qwen3-MoE casts them to bfloat16, Mixtral scales in float32) and the summing
    order (ascending expert, into a bfloat16 accumulator) are transformers'; the wrong rule is visibly off."""
    reference, config = reference_block(kind)
    reference = reference.to(torch.bfloat16)
    block = twin(reference, config)
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.enable_grad():  # torch's ops on both sides: the same matmul kernels
        want = run_reference(reference, x)
        assert torch.equal(block(x), want)
        block.config = dataclasses.replace(block.config, float32_scaling=not block.config.float32_scaling)
        wrong = block(x)
    assert (wrong.float() - want.float()).abs().max() > 1e-3 * want.float().abs().max()


def steered_block(kind: str) -> tuple[SparseMoeBlock, torch.nn.Module]:
    """A twin whose router reads hidden unit e as expert e's logit (x 8), so a test chooses each token's experts."""
    reference, config = reference_block(kind)
    with torch.no_grad():
        reference.gate.weight.copy_(torch.eye(EXPERTS, HIDDEN) * 8)
    return twin(reference, config), reference


def steered_tokens(choices: list[tuple[int, ...]]) -> torch.Tensor:
    """One token per entry, whose largest hidden units are its experts' (then small noise)."""
    x = torch.randn(len(choices), HIDDEN, generator=torch.Generator().manual_seed(3)) * 0.05
    for t, experts in enumerate(choices):
        for rank, e in enumerate(experts):
            x[t, e] = 1.0 - 0.2 * rank
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_idle_experts_and_an_expert_with_one_token(kind: str) -> None:
    block, reference = steered_block(kind)
    choices = [(0, 1)] * 5 + [(1, 0)] * 3 + [(0, 3)]  # expert 3 gets one token; 2 and 4-7 none
    x = steered_tokens(choices)
    cfg = block.config
    weights, expert_ids = route(block.router(x), cfg.num_experts_per_tok, cfg.norm_topk_prob, cfg.float32_scaling)
    groups = group_by_expert(expert_ids, weights, cfg.num_experts)
    assert groups.spans == ((0, 0, 9), (1, 9, 17), (3, 17, 18))
    assert groups.token_ids[17].item() == 8
    with torch.no_grad():
        assert_close(block(x), run_reference(reference, x))


@pytest.mark.parametrize("kind", KINDS)
def test_one_token_and_an_empty_step(kind: str) -> None:
    reference, config = reference_block(kind)
    block = twin(reference, config)
    x = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert_close(block(x), run_reference(reference, x))
        assert len(experts_hit(block, x)) == TOP_K
        empty = block(x[:0])
    assert empty.shape == (0, HIDDEN) and empty.dtype == torch.float32


def test_group_by_expert_sorts_pairs_stably() -> None:
    expert_ids = torch.tensor([[2, 0], [0, 2], [5, 0]])
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]])
    groups = group_by_expert(expert_ids, weights, num_experts=6)
    assert groups.spans == ((0, 0, 3), (2, 3, 5), (5, 5, 6))
    assert groups.token_ids.tolist() == [0, 1, 2, 0, 1, 2]
    assert groups.weights.tolist() == pytest.approx([0.4, 0.7, 0.1, 0.6, 0.3, 0.9])


def dense_moe(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, each output weighted by its routing weight (zero where not chosen)."""
    cfg = block.config
    probs = torch.softmax(F.linear(x, block.router.weight), dim=-1)
    top, ids = torch.topk(probs, cfg.num_experts_per_tok, dim=-1)
    if cfg.norm_topk_prob:
        top = top / top.sum(-1, keepdim=True)
    mixing = torch.zeros_like(probs).scatter(1, ids, top)  # [T, E]
    gate, up = torch.einsum("th,eih->eti", x, block.experts.gate_up_proj).chunk(2, dim=-1)
    outs = torch.einsum("eti,ehi->eth", F.silu(gate) * up, block.experts.down_proj)  # [E, T, H]
    return torch.einsum("te,eth->th", mixing, outs)


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(0, 24), num_experts=st.integers(1, 6), data=st.data(), norm=st.booleans(),
       seed=st.integers(0, 2**16))
def test_grouped_equals_dense(tokens: int, num_experts: int, data: st.DataObject, norm: bool, seed: int) -> None:
    top_k = data.draw(st.integers(1, num_experts))
    cfg = MoeConfig(hidden_size=16, num_experts=num_experts, num_experts_per_tok=top_k,
                    expert_intermediate_size=8, norm_topk_prob=norm)
    block = SparseMoeBlock(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
        x = torch.randn(tokens, 16, generator=generator)
        got, want = block(x), dense_moe(block, x)
    assert got.shape == (tokens, 16)
    if tokens:
        assert_close(got, want, rel=1e-5)


def test_weight_bytes_counts_every_expert() -> None:
    """Idle or not, all experts are resident; a token reads the router and top-k of them."""
    reference, config = reference_block("qwen3-norm-topk")
    block = twin(reference, config)
    router_bytes = EXPERTS * HIDDEN * 4
    expert_bytes = 3 * INTER * HIDDEN * 4
    packed = router_bytes if packs(block.router.weight) else 0
    assert block.weight_bytes() == router_bytes + EXPERTS * expert_bytes + packed
    assert block.bytes_read_per_token() == router_bytes + TOP_K * expert_bytes
    half = block.to(torch.bfloat16)
    assert half.experts.gate_up_proj.dtype == torch.bfloat16
    assert half.weight_bytes() == (router_bytes + EXPERTS * expert_bytes) // 2 + (
        router_bytes // 2 if packs(half.router.weight) else 0)
