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
class ModelStatus:
    name: str
    state: str  # loaded | loading | available
    memory_bytes: int  # held now (loaded or loading), else 0
    footprint_bytes: int
    users: int
    idle_s: float | None  # seconds since it last served; None: never used


@dataclass
class CacheHooks:
    """What the HTTP side is told; each runs on the worker thread and must not block long."""

    evicting: Callable[[str], None] = lambda name: None  # drop everything that holds this model's engine
    load_seconds: Callable[[float], None] = lambda s: None
    evicted: Callable[[str], None] = lambda name: None
    engine_died: Callable[[str], None] = lambda name: None  # on the engine's thread; the model is available again
    # a loaded model's listed adapters changed: (model, its engine, names to unload, (name, source) to load)
    adapters_changed: Callable[[str, Any, tuple[str, ...], tuple[tuple[str, str], ...]], None] = \
        lambda name, handle, unloads, loads: None
