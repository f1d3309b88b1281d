"""The native kernels' instruction sets as the kernel tests walk them: each one this CPU has, forced in turn
(model/quant_blocks.force_isa caps a request at what the CPU has, so asking for each gives the distinct ones)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from flotilla_server.model.quant_blocks import force_isa, quant_matmul

ISAS = ("scalar", "avx2", "avx512", "avx512_vnni")


def available_isas() -> list[str]:
    return sorted({force_isa(name) for name in ISAS}, key=ISAS.index)


def assert_rows_independent(types: Iterable[int], blocks_of: Callable[[int], torch.Tensor], k: int) -> None:
    """On every instruction set, each slice of 7 rows of x gives the rows' results alone: rows go in tiles,
    and a row's sums are the same whatever tile (and whatever other rows) it is in."""
    for qtype in types:
        blocks = blocks_of(qtype)
        x = torch.randn(7, k)
        for isa in available_isas():
            force_isa(isa)
            y = quant_matmul(x, blocks, qtype)
            for start, end in ((0, 1), (2, 3), (1, 7), (3, 5), (6, 7)):
                assert torch.equal(quant_matmul(x[start:end], blocks, qtype), y[start:end]), (qtype, isa, start, end)


def assert_dequantizer_bits(blocks: np.ndarray, qtype: int, expected_bits: np.ndarray) -> None:
    """The native dequantize_blocks gives `expected_bits` (uint32 view) on every instruction set, 1 and 2 threads."""
    n, k = expected_bits.shape
    for isa in available_isas():
        force_isa(isa)
        for count in (1, 2):
            torch.set_num_threads(count)
            out = torch.full((n, k), float("nan"))
            torch.ops.flotilla.dequantize_blocks(torch.from_numpy(blocks), int(qtype), out)
            assert np.array_equal(out.numpy().view(np.uint32), expected_bits), (isa, count, n, k)
