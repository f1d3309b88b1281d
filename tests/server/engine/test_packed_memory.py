"""The weights the pool is sized around include the packed copies the CPU matmuls keep beside them
(engine/memory_facts.weights_bytes, DecoderModel.packed_copy_bytes): after prefill and decode steps,
the copies held are exactly what was counted."""

from __future__ import annotations

import pytest
from flotilla_server.engine.memory_facts import weights_bytes
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.model import load_model
from flotilla_server.model.linear import ONEDNN, ONEDNN_BFLOAT16, PackedWeight

from .conftest import make_engine


def held_packed_bytes(model) -> int:
    return sum(v._packed.numel() * v._packed.element_size() for m in model.modules() for v in vars(m).values()
               if isinstance(v, PackedWeight) and v._packed is not None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_packed_copies_held_are_the_ones_counted(dtype: str) -> None:
    if not (ONEDNN if dtype == "float32" else ONEDNN_BFLOAT16):
        pytest.skip(f"no oneDNN {dtype} kernels on this CPU: nothing is packed")
    loaded = load_model("tiny", dtype, "cpu")
    model = loaded.model
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    engine = make_engine(loaded, device="cpu", dtype=dtype, num_kv_blocks=64, max_num_seqs=4)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for i in range(2):  # a prefill of several rows packs every projection and the head
        engine.add_request(str(i), [5, 6, 7, 8, 9, 10], params)
    while engine.has_unfinished():
        engine.step()
    held = held_packed_bytes(model)
    assert held > 0.9 * parameters  # tiny's head is tied: nearly every parameter has a packed copy
    assert model.packed_copy_bytes() == held
    assert weights_bytes(model) == parameters + held
