"""Captured decode steps (engine/decode_graphs.py): the same tokens as eager steps, padding that touches
no sequence's KV, and eager fallback past the budget and the cap.

On CPU the capture is `EagerBackend` (the same static buffers, filled per step, run instead of replayed);
with FLOTILLA_TEST_DEVICE=cuda the engine tests capture real CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch
from flotilla_server.engine.decode_graphs import DecodeGraphs, EagerBackend
from flotilla_server.engine.graph_shapes import GraphShapes
from flotilla_server.model import AttentionBatch, KVCacheTensors, load_model

from tests.support.hf_models import random_prompts

from .conftest import DEVICE, make_engine
from .test_engine_equality import CASES, check

BLOCK = 16


@pytest.mark.parametrize("case", CASES)
def test_graphed_engine_equals_transformers(hf_model, case) -> None:
    """16 prompts of 5-300 tokens and 2-24 new tokens: the batch shrinks as requests finish, so the
    padded rows and the padded blocks change from step to step."""
    path, loaded = hf_model(case)
    lengths = [5, 300, 17, 64, 65, 120, 8, 250, 33, 16, 15, 199, 47, 90, 6, 150]
    new_tokens = [2 + (7 * i) % 23 for i in range(len(lengths))]
    engine = make_engine(loaded, max_num_seqs=16, max_num_batched_tokens=512, prefill_chunk=128,
                         block_size=BLOCK, cuda_graphs=True)
    check(engine, path, random_prompts(lengths, seed=2), new_tokens)
    graphs = engine.runner.graphs
    assert graphs.replays > 10 and graphs.captured >= 3


def test_the_scratch_block_is_never_handed_out() -> None:
    engine = make_engine(load_model("tiny", "float32", DEVICE), num_kv_blocks=40, block_size=BLOCK,
                         max_model_len=256, cuda_graphs=True)
    assert engine.pool.num_blocks == 39 and engine.runner.kv.num_blocks == 40
    assert engine.runner.graphs.scratch_block == 39


def _tiny_step(contexts: list[int]) -> tuple:
    loaded = load_model("tiny", "float32", DEVICE)
    cfg, model = loaded.config, loaded.model
    torch.manual_seed(0)
    kv = KVCacheTensors.allocate(cfg.num_layers, 64, BLOCK, cfg.num_kv_heads, cfg.head_dim, torch.float32, DEVICE)
    for t in (*kv.k, *kv.v):
        t.normal_()
    tables, first = [], 0
    for c in contexts:  # disjoint tables, blocks 0..62; block 63 is the scratch block
        n = -(-c // BLOCK)
        tables.append(list(range(first, first + n)))
        first += n
    ids = [(11 * i + 3) % cfg.vocab_size for i in range(len(contexts))]
    return model, kv, tables, ids, [c - 1 for c in contexts]


def test_graph_logits_equal_the_eager_step_and_padding_touches_only_the_scratch_block() -> None:
    contexts = [37, 5, 100]  # 3 rows padded to 4, blocks padded to 8
    model, kv, tables, ids, positions = _tiny_step(contexts)
    before = [t.clone() for t in kv.k]
    eager_kv = KVCacheTensors([t.clone() for t in kv.k], [t.clone() for t in kv.v], kv.num_blocks, BLOCK)
    with torch.inference_mode():
        batch = AttentionBatch.build([1] * 3, contexts, tables, BLOCK, DEVICE)
        dev = lambda xs: torch.tensor(xs, device=DEVICE)  # noqa: E731
        eager = model.compute_logits(model(dev(ids), dev(positions), batch, eager_kv))
        graphs = DecodeGraphs(model, kv, GraphShapes(8, 512, BLOCK), 63, EagerBackend())
        graphed = graphs.run([1] * 3, contexts, ids, positions, tables)
    assert graphed is not None and graphs.captured == 1
    torch.testing.assert_close(graphed, eager, rtol=1e-5, atol=1e-5)
    scratch = slice(63 * BLOCK, 64 * BLOCK)
    for layer, (got, want, old) in enumerate(zip(kv.k, eager_kv.k, before, strict=True)):
        torch.testing.assert_close(got[: 63 * BLOCK], want[: 63 * BLOCK], rtol=1e-5, atol=1e-5,
                                   msg=f"layer {layer}: a pool slot differs from the eager step's")
        assert not torch.equal(got[scratch], old[scratch]), "the padding row wrote nowhere"


def test_the_same_shape_replays_and_new_shapes_stop_at_the_cap() -> None:
    model, kv, tables, ids, positions = _tiny_step([20, 30, 40])
    graphs = DecodeGraphs(model, kv, GraphShapes(8, 512, BLOCK, max_graphs=1), 63, EagerBackend())
    with torch.inference_mode():
        assert graphs.run([1] * 3, [20, 30, 40], ids, positions, tables) is not None
        assert graphs.run([1] * 3, [21, 31, 41], ids, [p + 1 for p in positions], tables) is not None  # (4, 4)
        assert graphs.run([1] * 2, [20, 30], ids[:2], positions[:2], tables[:2]) is None  # (2, 2): past the cap
    assert graphs.captured == 1 and graphs.replays == 2


def test_a_step_over_the_gather_budget_runs_eagerly() -> None:
    model, kv, tables, ids, positions = _tiny_step([200, 300])
    graphs = DecodeGraphs(model, kv, GraphShapes(8, 512, BLOCK, gather_budget_tokens=256), 63, EagerBackend())
    with torch.inference_mode():
        assert graphs.run([1] * 2, [200, 300], ids, positions, tables) is None  # 2 x 32 blocks x 16 > 256
    assert graphs.captured == 0
