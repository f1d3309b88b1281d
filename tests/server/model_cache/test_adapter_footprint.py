"""A base's footprint counts its LoRA adapters before loading it: the slots (--max-loras x --max-lora-rank in
the compute dtype) and every listed adapter's float32 host copy, read from its safetensors header. Checked
against what a loaded engine holds: weights + KV pool + LoraSlots.nbytes + LoraAdapter.nbytes(4) each."""

from __future__ import annotations

import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.model.lora_linear import LoraSlots
from flotilla_server.model.source import source_config
from flotilla_server.model_cache.adapter_footprint import adapter_host_bytes, slot_bytes
from flotilla_server.model_cache.engine_processes import EngineProcesses
from flotilla_server.model_cache.footprint import kv_block_bytes

from tests.support.hf_models import make_hf_model_dir
from tests.support.lora_adapters import make_lora_adapter

BLOCKS = 16


@pytest.fixture(scope="module")
def base_and_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter-footprint")
    base = make_hf_model_dir("llama", root / "base")
    adapters = (("a", str(make_lora_adapter(base, root / "a", rank=8, seed=1))),
                ("b", str(make_lora_adapter(base, root / "b", rank=4, seed=2, targets=("q_proj", "v_proj")))))
    return base, adapters


def test_the_footprint_is_what_a_loaded_engine_holds_adapters_included(base_and_adapters):
    base, adapters = base_and_adapters
    sizes = {"num_kv_blocks": BLOCKS, "max_loras": 3, "max_lora_rank": 16}
    core = EngineCore(EngineConfig(model=str(base), loras=adapters, lora_runtime_loads=True, **sizes))
    mc, cache = core.loaded.config, core.adapters
    assert cache is not None and cache.slots.max_loras == 3  # runtime loads on: every slot from start
    kv = BLOCKS * kv_block_bytes(mc, core.config.block_size, "float32")
    weights = core.loaded.model.weight_bytes()
    held = weights + kv + cache.slots.nbytes() + sum(a.nbytes(4) for a in cache.adapters.values())
    engines = EngineProcesses(EngineConfig(**sizes))
    assert engines.footprint_bytes(str(base), None, adapters) == held
    assert engines.footprint_bytes(str(base)) == weights + kv  # no adapters: no slots
    for name, source in adapters:
        assert adapter_host_bytes(name, source) == cache.adapters[name].nbytes(4)


@pytest.mark.parametrize(("dtype", "torch_dtype"), [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_slot_bytes_are_the_slots_allocation_in_the_compute_dtype(base_and_adapters, dtype, torch_dtype):
    mc = source_config(str(base_and_adapters[0]))
    assert slot_bytes(mc, 2, 8, dtype) == LoraSlots(mc, 2, 8, torch_dtype).nbytes()


def test_an_unreadable_adapter_is_named(tmp_path, base_and_adapters):
    engines = EngineProcesses(EngineConfig(num_kv_blocks=BLOCKS))
    with pytest.raises(ValueError, match=r"adapter 'gone': .*adapter_model\.safetensors not found"):
        engines.footprint_bytes(str(base_and_adapters[0]), None, (("gone", str(tmp_path / "gone")),))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "adapter_model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match=r"adapter 'junk': .* is not a safetensors file"):
        adapter_host_bytes("junk", str(tmp_path / "junk"))
