"""Which decode steps replay a captured graph, and at which padded shape (engine/graph_shapes.py)."""

from __future__ import annotations

import pytest
from flotilla_server.engine.graph_shapes import (
    MAX_CAPTURE_SIZE,
    GraphShapes,
    capture_sizes,
    padded_blocks,
    padded_rows,
)


def test_capture_sizes_are_1_2_4_then_multiples_of_8_up_to_the_slots() -> None:
    assert capture_sizes(1) == (1,)
    assert capture_sizes(3) == (1, 2, 3)
    assert capture_sizes(8) == (1, 2, 4, 8)
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert capture_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert capture_sizes(10_000)[-1] == MAX_CAPTURE_SIZE


def test_rows_pad_to_the_next_size_and_too_many_rows_run_eagerly() -> None:
    sizes = capture_sizes(64)
    assert [padded_rows(n, sizes) for n in (1, 2, 3, 5, 8, 9, 63, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert padded_rows(65, sizes) is None


def test_blocks_pad_to_a_power_of_two_within_the_model_length() -> None:
    assert [padded_blocks(n, 512) for n in (1, 2, 3, 5, 17, 512)] == [1, 2, 4, 8, 32, 512]
    assert padded_blocks(300, 320) == 320  # the next power of two would pass max_model_len's blocks


def test_shape_for_a_decode_step() -> None:
    shapes = GraphShapes(max_num_seqs=16, max_model_len=2048, block_size=16)
    assert shapes.shape_for([1, 1, 1], [17, 40, 5]) == (4, 4)  # 40 tokens: 3 blocks, padded to 4
    assert shapes.shape_for([1], [16]) == (1, 1)
    assert shapes.shape_for([1], [17]) == (1, 2)


@pytest.mark.parametrize(("query_lens", "context_lens"), [
    ([5, 1], [5, 20]),  # a prefill chunk beside a decode row
    ([2], [30]),  # a prefill chunk alone
    ([], []),
])
def test_steps_with_prefill_run_eagerly(query_lens: list[int], context_lens: list[int]) -> None:
    assert GraphShapes(16, 2048, 16).shape_for(query_lens, context_lens) is None


def test_a_gather_over_the_budget_runs_eagerly() -> None:
    shapes = GraphShapes(max_num_seqs=64, max_model_len=8192, block_size=16, gather_budget_tokens=4096)
    assert shapes.shape_for([1] * 8, [500] * 8) == (8, 32)  # 8 x 32 x 16 = 4,096 tokens
    assert shapes.shape_for([1] * 8, [513] * 8) is None  # 8 x 64 x 16
    assert shapes.shape_for([1] * 9, [500] * 9) is None  # 16 x 32 x 16


def test_no_new_shape_is_captured_past_the_cap() -> None:
    shapes = GraphShapes(16, 2048, 16, max_graphs=2)
    assert shapes.may_capture(1)
    assert not shapes.may_capture(2)
    assert not GraphShapes(16, 2048, 16, max_graphs=0).may_capture(0)


def test_invalid_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        GraphShapes(0, 2048, 16)
    with pytest.raises(ValueError, match="max_graphs"):
        GraphShapes(16, 2048, 16, max_graphs=-1)
