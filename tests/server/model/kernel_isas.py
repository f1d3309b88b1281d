"""The native kernels' instruction sets as the kernel tests walk them: each one this CPU has, forced in turn
(model/quant_blocks.force_isa caps a request at what the CPU has, so asking for each gives the distinct ones)."""

from __future__ import annotations

from flotilla_server.model.quant_blocks import force_isa

ISAS = ("scalar", "avx2", "avx512", "avx512_vnni")


def available_isas() -> list[str]:
    return sorted({force_isa(name) for name in ISAS}, key=ISAS.index)
