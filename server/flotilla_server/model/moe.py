"""SparseMoeBlock: a mixture-of-experts feed-forward block (Qwen3-MoE, Mixtral) that stands where llama.py's MLP
does: the flat tokens of a step in, [T, hidden], the same shape out.

Why this shape:
- a step's tokens are grouped by expert, not run one by one: its (token, slot) pairs are sorted by expert id,
  each expert that received tokens makes one gate/up and one down matmul over all of them at once, and the
  results go back in one index_add_, weighted by the routing weights. The Python loop runs over the experts
  hit (at most num_experts, at most T x top-k), never over tokens, so a 2,000-token prefill chunk costs as
  many matmul calls as a decode step that touches every expert, and each call is as large as it can be;
- the experts are stacked, [E, 2 x I, H] (gate rows, then up) and [E, H, I], in the model dtype: transformers
  5's own layout, so its state dict loads as it is and a per-expert checkpoint is copied in by slices
  (model/moe_weights.py), and each matrix kind is one tensor however many experts there are; a GGUF's
  expert blocks may stay blocks instead (model/quant_experts.py), with the same `run(expert, rows)`;
- every expert is resident whatever a step routes, so `weight_bytes` counts all of them: that is what the KV
  pool's sizing and the model cache must subtract. A token reads only its top-k experts
  (`bytes_read_per_token`), which is what a memory-bound decode step's speed follows;
- routing is a pure function (`route`), apart from the grouping mechanism (`group_by_expert`), and follows
  transformers 5.23 in order and dtypes: router logits in the model dtype, softmax in float32, top-k, then
  (Qwen3-MoE with norm_topk_prob, Mixtral always) the k weights divided by their sum; Qwen3-MoE then casts
  the weights to the model dtype, Mixtral scales in float32 and casts the product (model/moe_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import decode_ops
from .linear import Linear, packs, uses_native_gemv
from .moe_config import MoeConfig
from .native_gemv import gemv_one_row


def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool,
          float32_scaling: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert ids [T, k] int64) from router logits [T, E] in the model dtype. The weights are
    float32 where `float32_scaling` (Mixtral), else in the logits' dtype (Qwen3-MoE)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if float32_scaling else weights.to(router_logits.dtype)), expert_ids


@dataclass(frozen=True)
class ExpertGroups:
    """A step's (token, slot) pairs, sorted by expert: pair j goes to token `token_ids[j]` with weight
    `weights[j]`; pairs `start:end` of each span (expert, start, end) run through that expert."""

    token_ids: torch.Tensor  # [T * k] int64
    weights: torch.Tensor  # [T * k]
    spans: tuple[tuple[int, int, int], ...]  # only experts with at least one pair, ascending

    @property
    def experts_hit(self) -> tuple[int, ...]:
        return tuple(expert for expert, _, _ in self.spans)


def group_by_expert(expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int) -> ExpertGroups:
    """Groups `route`'s choices by expert. The sort is stable: within an expert, tokens keep their order, and
    each token's contributions are summed in ascending expert order (as transformers' loop adds them)."""
    top_k = expert_ids.shape[-1]
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # the step's one device sync
    spans, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            spans.append((expert, start, start + count))
            start += count
    return ExpertGroups(order // top_k, weights.reshape(-1)[order], tuple(spans))


class Experts(nn.Module):
    """E SwiGLU experts in the model dtype, stacked: `gate_up_proj` [E, 2 x I, H] (gate rows, then up) and
    `down_proj` [E, H, I], transformers 5's own layout and names (`mlp.experts.gate_up_proj`). The parameters
    start uninitialised (a loader fills them)."""

    def __init__(self, num_experts: int, intermediate_size: int, hidden_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def run(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """Expert `expert`'s SwiGLU over its rows [n, H]: [n, H] in the rows' dtype."""
        gate_up = expert_linear(rows, self.gate_up_proj[expert])
        return expert_linear(decode_ops.silu_mul(gate_up), self.down_proj[expert])


def expert_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T for one expert's 2-D slice: a lone float32 row (a decode step's token) through the native
    one-row kernel, which streams the row-major slice as it lies; more rows through F.linear. No packed copy:
    an expert sees a few rows a step, and a copy would double the experts' memory."""
    if uses_native_gemv(x, weight):
        return gemv_one_row(x, weight)
    return F.linear(x, weight)


class SparseMoeBlock(nn.Module):
    """Router (`router`, a Linear hidden -> E without bias) and E SwiGLU experts (`experts`: Experts, or
    quant_experts.QuantizedExperts where a GGUF's expert blocks are kept)."""

    def __init__(self, cfg: MoeConfig) -> None:
        super().__init__()
        self.config = cfg
        e, i, h = cfg.num_experts, cfg.expert_intermediate_size, cfg.hidden_size
        self.router = Linear(h, e, bias=False)
        self.experts = Experts(e, i, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden], a step's flat tokens. Returns [T, hidden] in x's dtype."""
        cfg = self.config
        weights, expert_ids = route(self.router.forward(x), cfg.num_experts_per_tok, cfg.norm_topk_prob,
                                    cfg.float32_scaling)
        groups = group_by_expert(expert_ids, weights, cfg.num_experts)
        rows = x.index_select(0, groups.token_ids)  # one gather: [T * k, hidden], each expert's rows contiguous
        experts = self.experts
        outs = [experts.run(expert, rows[start:end]) for expert, start, end in groups.spans]  # idle experts: none
        expert_out = torch.cat(outs) if outs else rows
        # Qwen3-MoE's weights are in x's dtype; Mixtral's float32 ones promote the product to float32
        weighted = (expert_out * groups.weights.unsqueeze(1)).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, groups.token_ids, weighted)

    def weight_bytes(self) -> int:
        """Every byte of weights the block holds: the router and all experts, idle ones too, plus the router's
        packed copy where the CPU matmul path keeps one (as DecoderModel.weight_bytes counts a Linear's)."""
        held = sum(t.numel() * t.element_size() for t in (*self.parameters(), *self.buffers()))
        router = getattr(self.router, "weight", None)
        return held + (router.numel() * router.element_size() if router is not None and packs(router) else 0)

    def bytes_read_per_token(self) -> int:
        """The weight bytes one token's pass reads: the router and its top-k experts (a decode step at batch 1
        reads these, not `weight_bytes`)."""
        cfg = self.config
        router = sum(t.numel() * t.element_size() for t in (*self.router.parameters(), *self.router.buffers()))
        experts = sum(t.numel() * t.element_size() for t in (*self.experts.parameters(), *self.experts.buffers()))
        return router + cfg.num_experts_per_tok * experts // cfg.num_experts
