"""What the model cache tells its users: model states, its refusals, each model's status, and its hooks.

Torch-free and small, so the HTTP layer and the metrics read them without the cache's machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

AVAILABLE, LOADING, LOADED = "available", "loading", "loaded"


class UnknownModel(LookupError):
    pass


class Infeasible(ValueError):
    """The model can never fit the memory budget."""


class LoadTimeout(TimeoutError):
    pass


class LoadFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class LoadRecord:
    """One finished load: where its weights came from and where its time went. `seconds` is the whole load
    as the cache saw it; the rest beyond the three phases is the engine process's start (a fork, or waking a
    parked one) and the pipe."""

    origin: str  # disk (its source) | parked (model_cache/parking.py)
    seconds: float
    read_s: float = 0.0
    build_s: float = 0.0
    warmup_s: float = 0.0

    @property
    def start_s(self) -> float:
        """Starting (forking) or waking the engine process, and hearing from it: the rest of `seconds`."""
        return max(0.0, self.seconds - self.read_s - self.build_s - self.warmup_s)

    def phases(self) -> dict[str, float]:
        """Every phase (flotilla_contract.metrics.MODEL_LOAD_PHASE_SECONDS' `phase`); they sum to `seconds`."""
        return {"start": self.start_s, "read": self.read_s, "build": self.build_s, "warmup": self.warmup_s}


@dataclass(frozen=True)
class ModelStatus:
    name: str
    state: str  # loaded | loading | available
    memory_bytes: int  # held now (loaded or loading), else 0
    footprint_bytes: int
    users: int
    idle_s: float | None  # seconds since it last served; None: never used
    last_load: LoadRecord | None = None  # its latest finished load
    parked_bytes: int = 0  # parked (outside the budget): its parked weights and its parked process's own memory


@dataclass
class CacheHooks:
    """What the HTTP side is told; each runs on the worker thread and must not block long."""

    evicting: Callable[[str], None] = lambda name: None  # drop everything that holds this model's engine
    load_seconds: Callable[[float], None] = lambda s: None
    loaded: Callable[[str, LoadRecord], None] = lambda name, record: None  # each finished load, its phases
    evicted: Callable[[str], None] = lambda name: None
    engine_died: Callable[[str], None] = lambda name: None  # on the engine's thread; the model is available again
    # a loaded model's listed adapters changed: (model, its engine, names to unload, (name, source) to load)
    adapters_changed: Callable[[str, Any, tuple[str, ...], tuple[tuple[str, str], ...]], None] = \
        lambda name, handle, unloads, loads: None
