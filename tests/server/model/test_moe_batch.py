"""A batch of sequences that route to different experts in the same steps, run through each sparse layer's one
grouped pass (model/moe.py), equals transformers run one sequence at a time: the grouping never mixes one
sequence's tokens into another's output."""

from __future__ import annotations

import pytest
import torch
from flotilla_server.model import load_model
from flotilla_server.model.moe import SparseMoeBlock

from tests.support.hf_models import hf_greedy, random_prompts

from .conftest import DEVICE
from .paged import paged_greedy

SEQUENCES = 6


@pytest.mark.parametrize("variant", ["qwen3moe-dense-layer", "mixtral-window"])
def test_sequences_choosing_different_experts_in_one_step_get_transformers_tokens(hf_model_dir, monkeypatch, variant):
    path = hf_model_dir(variant)
    model = load_model(str(path), "float32", DEVICE).model
    sparse = [layer.mlp for layer in model.layers if isinstance(layer.mlp, SparseMoeBlock)]
    chosen: list[torch.Tensor] = []  # each sparse block's top-k expert ids [T, k], call by call

    def spy(block: SparseMoeBlock):
        router = block.router.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            logits = router(x)
            chosen.append(logits.topk(block.config.num_experts_per_tok, dim=-1).indices)  # softmax keeps the order
            return logits
        return forward

    for block in sparse:
        monkeypatch.setattr(block.router, "forward", spy(block))
    prompts = random_prompts([9, 31, 4, 17, 12, 23], seed=6)
    got = paged_greedy(model, prompts, 6, chunk=8)
    decode_steps = [ids for ids in chosen if ids.shape[0] == SEQUENCES]  # one row a sequence: all of them decoding
    assert decode_steps, "no step decoded every sequence at once"
    for ids in decode_steps:
        choices = {frozenset(row.tolist()) for row in ids}
        assert len(choices) > 1, f"every sequence chose experts {choices}: the batch would not test the grouping"
    assert sum(len({e for row in ids.tolist() for e in row}) for ids in decode_steps) > 3 * len(decode_steps)
    assert got == hf_greedy(path, prompts, 6, DEVICE)
