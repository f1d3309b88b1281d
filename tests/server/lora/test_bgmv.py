"""The native LoRA product (model/kernels/lora_bgmv.cpp, `torch.ops.flotilla.lora_bgmv`) against the torch path
it replaces in float32 on CPU: within float rounding, the same bits on one thread and two, base rows untouched,
a row's result independent of the other rows' slots, on every instruction set (a subprocess per forced ISA,
since the path is picked at load), and bad shapes refused by the op."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from flotilla_server.model import lora_linear
from flotilla_server.model.lora_linear import BASE_SLOT, LoraSlots
from flotilla_server.model.tiny import TINY_CONFIG

from tests.server.http.server_process import REPO

native = pytest.mark.skipif(lora_linear._lora_bgmv is None, reason="the native kernels are not built (make setup)")


def filled_slots(seed: int = 0, max_loras: int = 4, rank: int = 8) -> LoraSlots:
    slots = LoraSlots(TINY_CONFIG, max_loras, rank, torch.float32)
    g = torch.Generator().manual_seed(seed)
    for t in (*slots.a.values(), *slots.b.values()):
        t.copy_(torch.randn(t.shape, generator=g))
    return slots


def both_paths(slots: LoraSlots, rows: torch.Tensor, x: torch.Tensor, y: torch.Tensor, key=(1, "self_attn.qkv_proj")):
    slots._native = True
    slots.set_rows(rows)
    fast = slots.add(*key, x, y.clone())
    slots._native = False
    slots.set_rows(rows)
    slow = slots.add(*key, x, y.clone())
    slots._native = lora_linear._lora_bgmv is not None
    return fast, slow


@native
@pytest.mark.parametrize("key", [(0, "self_attn.qkv_proj"), (1, "self_attn.o_proj"), (2, "mlp.gate_up_proj"),
                                 (3, "mlp.down_proj")])
@pytest.mark.parametrize("num_rows", [1, 3, 17, 40])
def test_the_native_product_is_the_torch_path_s_within_rounding(key, num_rows):
    slots = filled_slots()
    g = torch.Generator().manual_seed(num_rows)
    rows = torch.randint(-1, 4, (num_rows,), generator=g)
    in_size, out_size = slots.a[key].shape[2], slots.b[key].shape[2]
    x, y = torch.randn(num_rows, in_size, generator=g), torch.randn(num_rows, out_size, generator=g)
    fast, slow = both_paths(slots, rows, x, y, key)
    scale = (x.abs() @ slots.a[key].abs().amax(0).t()).abs().sum(1, keepdim=True) * slots.b[key].abs().max()
    assert torch.all((fast - slow).abs() <= 1e-5 * scale + 1e-5)
    base = rows == BASE_SLOT
    assert torch.equal(fast[base], y[base])  # base rows: not touched


@native
def test_same_bits_on_one_thread_and_two_and_rows_independent_of_the_others():
    slots = filled_slots(1)
    x, y = torch.randn(24, 256), torch.randn(24, slots.b[(0, "self_attn.qkv_proj")].shape[2])
    rows = torch.tensor([i % 4 for i in range(24)])
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            slots.set_rows(rows)
            results.append(slots.add(0, "self_attn.qkv_proj", x, y.clone()))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])
    slots.set_rows(rows[5:6])  # row 5 alone
    alone = slots.add(0, "self_attn.qkv_proj", x[5:6], y[5:6].clone())
    assert torch.equal(alone[0], results[0][5])


@native
def test_bad_arguments_are_refused_by_the_op():
    slots = filled_slots()
    a, b, ends = slots.a[(0, "mlp.down_proj")], slots.b[(0, "mlp.down_proj")], slots.part_ends["mlp.down_proj"]
    x, y = torch.randn(2, a.shape[2]), torch.zeros(2, b.shape[2])
    with pytest.raises(RuntimeError, match=r"slot 9 is outside -1\.\.3"):
        torch.ops.flotilla.lora_bgmv(x, torch.tensor([0, 9]), a, b, ends, y)
    with pytest.raises(RuntimeError, match="shapes do not agree"):
        torch.ops.flotilla.lora_bgmv(x[:, :-1].contiguous(), torch.tensor([0, 1]), a, b, ends, y)


@native
@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_each_instruction_set_agrees_with_the_torch_path(isa):
    script = ("import torch; from tests.server.lora.test_bgmv import filled_slots, both_paths;"
              "s = filled_slots(); g = torch.Generator().manual_seed(3); rows = torch.randint(-1, 4, (9,), generator=g);"
              "x = torch.randn(9, 256, generator=g); y = torch.randn(9, s.b[(1, 'self_attn.qkv_proj')].shape[2]);"
              "f, w = both_paths(s, rows, x, y); print(float((f - w).abs().max()), float(w.abs().max()))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "FLOTILLA_KERNEL_ISA": isa})
    assert done.returncode == 0, done.stderr
    difference, largest = map(float, done.stdout.split())
    assert difference <= 1e-5 * largest
