"""The adapter cache (mechanism): every `--lora` adapter read into host memory at start, `max_loras` of them
resident in the model's slots (model/lora_linear.py LoraSlots), moved in as engine/adapter_residency.py says.

Why at start: a bad adapter (a rank over `--max-lora-rank`, another base, DoRA...) refuses the start in one
line naming it, instead of failing the first request that names it. Host memory holds the float32 factors
(LoraAdapter.nbytes(4) each); the slots hold `max_loras` of them in the compute dtype, allocated once.

Rules:
- a load is a copy from host memory into a slot, synchronous and between steps (the engine loop is the one
  writer: no step reads a slot while it changes);
- an adapter with a sequence running or waiting in the engine is never evicted (the residency rule);
- loads and evictions are counted (metrics to come).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from torch import nn

from flotilla_server.engine.adapter_residency import choose_slot
from flotilla_server.model.config import ModelConfig
from flotilla_server.model.lora_adapter import LoraAdapter, LoraAdapterError, load_adapter
from flotilla_server.model.lora_linear import BASE_SLOT, LoraSlots, install_lora


def read_adapters(specs: tuple[tuple[str, str], ...], base: ModelConfig, max_rank: int) -> dict[str, LoraAdapter]:
    """Each (name, source) read and checked against the base; ValueError naming the flag and the adapter."""
    adapters = {}
    for name, source in specs:
        try:
            adapters[name] = load_adapter(name, source, base, max_rank)
        except LoraAdapterError as e:
            text = str(e)
            raise ValueError("--lora's adapter" + text.removeprefix("LoRA adapter") if text.startswith("LoRA adapter")
                             else f"--lora's adapter {name!r}: {text}") from None
    return adapters


class AdapterCache:
    def __init__(self, adapters: dict[str, LoraAdapter], slots: LoraSlots,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.adapters = adapters  # host memory: every adapter served, by name
        self.slots = slots
        self.resident: list[str | None] = [None] * slots.max_loras  # per slot, its adapter
        self.last_used_s: dict[str, float] = {}
        self.loads = 0
        self.evictions = 0
        self._clock = clock

    @classmethod
    def build(cls, model: nn.Module, config: ModelConfig, specs: tuple[tuple[str, str], ...], max_loras: int,
              max_rank: int, dtype: torch.dtype, device: str | torch.device) -> AdapterCache:
        """Reads the adapters, allocates the slots (no more than there are adapters) and wraps the model's
        projections (a model wrapped before is bound to the new slots)."""
        adapters = read_adapters(specs, config, max_rank)
        slots = LoraSlots(config, min(max_loras, len(adapters)), max_rank, dtype, device)
        install_lora(model, slots)
        return cls(adapters, slots)

    def slot_of(self, name: str | None) -> int:
        """The slot of a resident adapter (BASE_SLOT for the base model); KeyError for one not resident."""
        return BASE_SLOT if name is None else self.resident.index(name)

    def acquire(self, name: str, sequences_by_adapter: Mapping[str, int]) -> bool:
        """Make `name` resident, loading it into a slot (evicting per the rule) if needed; False when every slot
        is pinned by adapters in use."""
        choice = choose_slot(self.resident, name, sequences_by_adapter, self.last_used_s)
        if choice is None:
            return False
        if choice.load:
            if choice.evicts is not None:
                self.evictions += 1
                self.last_used_s.pop(choice.evicts, None)
            self.slots.load(choice.slot, self.adapters[name])
            self.resident[choice.slot] = name
            self.loads += 1
        self.last_used_s[name] = self._clock()
        return True

    def touch(self, names: set[str]) -> None:
        """The adapters a step served were used now."""
        now = self._clock()
        for name in names:
            self.last_used_s[name] = now
