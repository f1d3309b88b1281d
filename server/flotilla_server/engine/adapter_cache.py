"""The adapter cache (mechanism): every adapter served held in host memory, `max_loras` of them resident in
the model's slots (model/lora_linear.py LoraSlots), moved in as engine/adapter_residency.py says.

Why `--lora` adapters are read at start: a bad adapter (a rank over `--max-lora-rank`, another base, DoRA...)
refuses the start in one line naming it, instead of failing the first request that names it. Host memory
holds the float32 factors (LoraAdapter.nbytes(4) each); the slots hold `max_loras` of them in the compute
dtype, allocated once. Adapters loaded at run time (engine/adapter_service.py) are added here once read.

Keys: inside the engine a sequence names its adapter by a key, not by the name clients send. The first
adapter under a name has the name as its key; one loaded under the same name after an unload gets a new
key (name, NUL, a count), so that the prefix cache, which hashes the key (engine/block_hash.py), never
serves the old adapter's KV blocks to the new one, and the old one's last sequences keep their own.

Rules:
- a load is a copy from host memory into a slot, synchronous and between steps (the engine loop is the one
  writer: no step reads a slot while it changes);
- an adapter with a sequence running or waiting in the engine is never evicted (the residency rule);
- an unloaded adapter is no longer served (new requests naming it are refused) but is held until no
  sequence or queued request uses it (`release`); then its slot frees and its host memory goes;
- loads, evictions and the seconds loads took are counted (the /metrics series).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from torch import nn

from flotilla_server.engine.adapter_residency import choose_slot
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.lora_list import LoraListFile, read_at_start
from flotilla_server.model.config import ModelConfig
from flotilla_server.model.lora_adapter import LoraAdapter, LoraAdapterError, load_adapter
from flotilla_server.model.lora_linear import BASE_SLOT, LoraSlots, install_lora


def read_adapters(specs: tuple[tuple[str, str], ...], base: ModelConfig, max_rank: int,
                  flag: str = "--lora") -> dict[str, LoraAdapter]:
    """Each (name, source) read and checked against the base; ValueError naming the flag and the adapter."""
    adapters = {}
    for name, source in specs:
        try:
            adapters[name] = load_adapter(name, source, base, max_rank)
        except LoraAdapterError as e:
            text = str(e)
            raise ValueError(f"{flag}'s adapter" + text.removeprefix("LoRA adapter") if text.startswith("LoRA adapter")
                             else f"{flag}'s adapter {name!r}: {text}") from None
    return adapters


def start_adapters(model: nn.Module, base: ModelConfig, config: EngineConfig,
                   dtype: torch.dtype) -> tuple[AdapterCache | None, LoraListFile | None, dict[str, str]]:
    """The cache at start (None: no adapters may be served), with the list file and what it listed: its
    adapters are read with the --lora ones, and a bad one refuses the start as theirs do."""
    list_file, listed = read_at_start(config.lora_list_file, tuple(name for name, _ in config.loras))
    if not config.serves_adapters:
        return None, None, {}
    cache = AdapterCache.build(model, base, config.loras + tuple(listed.items()), config.max_loras,
                               config.max_lora_rank, dtype, config.device,
                               runtime=bool(config.lora_list_file or config.lora_runtime_loads),
                               flags=dict.fromkeys(listed, "--lora-list-file"))
    return cache, list_file, listed


class AdapterCache:
    def __init__(self, adapters: dict[str, LoraAdapter], slots: LoraSlots,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.adapters = adapters  # host memory, by key: every adapter served, and those unloaded still in use
        self.served: dict[str, str] = {name: name for name in adapters}  # name clients send -> key
        self.names: dict[str, str] = {key: key for key in adapters}  # key -> name
        self.slots = slots
        self.resident: list[str | None] = [None] * slots.max_loras  # per slot, its adapter's key
        self.last_used_s: dict[str, float] = {}
        self.loads = 0
        self.evictions = 0
        self.load_seconds = 0.0  # the copies into slots, summed
        self._clock = clock
        self._generations: dict[str, int] = dict.fromkeys(adapters, 0)  # loads under each name, less one
        self._retired: set[str] = set()  # keys unloaded and still held

    @classmethod
    def build(cls, model: nn.Module, config: ModelConfig, specs: tuple[tuple[str, str], ...], max_loras: int,
              max_rank: int, dtype: torch.dtype, device: str | torch.device, *, runtime: bool = False,
              flags: dict[str, str] | None = None) -> AdapterCache:
        """Reads the adapters, allocates the slots and wraps the model's projections (a model wrapped before is
        bound to the new slots). Slots: no more than there are adapters, unless adapters may come at run time
        (`runtime`); `flags`: the flag that named each adapter, for the refusal (default --lora)."""
        flags = flags or {}
        adapters: dict[str, LoraAdapter] = {}
        for name, source in specs:
            adapters |= read_adapters(((name, source),), config, max_rank, flags.get(name, "--lora"))
        slots = LoraSlots(config, max_loras if runtime else min(max_loras, len(adapters)), max_rank, dtype, device)
        install_lora(model, slots)
        return cls(adapters, slots)

    def slot_of(self, key: str | None) -> int:
        """The slot of a resident adapter (BASE_SLOT for the base model); KeyError for one not resident."""
        return BASE_SLOT if key is None else self.resident.index(key)

    # --- served names ---------------------------------------------------------------------------

    def key_of(self, name: str) -> str | None:
        """The key new requests naming `name` run under; None when it is not served."""
        return self.served.get(name)

    def source_of(self, name: str) -> str | None:
        """Where the adapter served under `name` was read from (as given); None when it is not served."""
        key = self.served.get(name)
        return None if key is None else self.adapters[key].source

    def add(self, adapter: LoraAdapter) -> str:
        """Serve an adapter read at run time under its name (not served now); returns its key."""
        name = adapter.name
        assert name not in self.served, name
        generation = self._generations.get(name, -1) + 1
        self._generations[name] = generation
        key = name if generation == 0 else f"{name}\x00{generation}"
        self.adapters[key] = adapter
        self.served[name] = key
        self.names[key] = name
        return key

    def retire(self, name: str) -> str:
        """Stop serving `name` (it must be served); it is held until `release` finds it unused."""
        key = self.served.pop(name)
        self._retired.add(key)
        return key

    def release(self, in_use: set[str]) -> list[str]:
        """Drop the unloaded adapters no sequence or queued request uses (`in_use`: keys): their slots free and
        their host memory goes. Returns the names dropped."""
        gone = [key for key in self._retired if key not in in_use]
        for key in gone:
            self._retired.discard(key)
            if key in self.resident:  # free for the next load, which clears it first (LoraSlots.load)
                self.resident[self.resident.index(key)] = None
            del self.adapters[key]
            self.last_used_s.pop(key, None)
        return [self.names.pop(key) for key in gone]

    def acquire(self, key: str, sequences_by_adapter: Mapping[str, int]) -> bool:
        """Make adapter `key` resident, loading it into a slot (evicting per the rule) if needed; False when
        every slot is pinned by adapters in use."""
        choice = choose_slot(self.resident, key, sequences_by_adapter, self.last_used_s)
        if choice is None:
            return False
        if choice.load:
            if choice.evicts is not None:
                self.evictions += 1
                self.last_used_s.pop(choice.evicts, None)
            start = time.perf_counter()
            self.slots.load(choice.slot, self.adapters[key])
            self.load_seconds += time.perf_counter() - start
            self.resident[choice.slot] = key
            self.loads += 1
        self.last_used_s[key] = self._clock()
        return True

    def touch(self, keys: set[str]) -> None:
        """The adapters a step served were used now."""
        now = self._clock()
        for key in keys:
            self.last_used_s[key] = now
