"""The one interface between the model cache and the engines it starts and stops.

The cache knows only `Engines` (footprint_bytes, load, unload) and the `ModelEngine` handle it returns
(docs/architecture.md, "Model cache"). The implementation is `engine_processes.EngineProcesses`: a load
starts an engine process and returns a handle holding that process's client. Torch-free, so the HTTP layer
may name the handle's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from flotilla_server.engine.client import EngineClient
from flotilla_server.engine.park_messages import LoadPhases


@dataclass(frozen=True, eq=False)
class ModelEngine:
    """A loaded model: its started engine and what the HTTP layer needs to serve it."""

    name: str
    source: str
    engine: EngineClient
    tokenizer: Any  # flotilla_server.model.tokenizer.Tokenizer
    vocab_size: int
    max_model_len: int
    memory_bytes: int  # weights, KV pool and adapters (slots, host copies of those it started with), once loaded
    description: str = ""
    weight_bytes: int = 0  # the weights' share of memory_bytes
    quantization: str = "none"  # how the weights are held (engine/messages.EngineInfo)
    is_demonstration: bool = False
    adapter_slots: int = 0  # LoRA slots (--max-loras); 0: started without adapters, it takes none at run time
    origin: str = "disk"  # where its weights came from: disk (its source) or parked (parking.py)
    phases: LoadPhases | None = None  # its load's read, build and warm-up seconds, measured in its engine


class Engines(Protocol):
    def footprint_bytes(self, source: str, quantization: str | None = None,
                        adapters: tuple[tuple[str, str], ...] = ()) -> int:
        """Memory the model will hold once loaded, before loading it; ValueError if the source is unusable.
        `quantization`: how its weights are held (flags.QUANTIZATIONS); None: the engines' default.
        `adapters`: its LoRA adapters, (name, PEFT directory), whose slots and host copies count too."""

    def load(self, name: str, source: str, models_at_once: int = 1, quantization: str | None = None,
             adapters: tuple[tuple[str, str], ...] = ()) -> ModelEngine:
        """Load and start, serving `adapters`; runs on the cache's load worker, never on the event loop.
        `models_at_once`: how many models the budget can hold together (threads.most_resident), which share
        the CPU threads."""

    def unload(self, handle: ModelEngine, park: bool = True, loading: str | None = None) -> None:
        """Stop the engine and free its memory; the caller has dropped every other reference to it. With
        `park`, its weights may be parked outside the budget for a quicker next load (parking.py); `loading`:
        the model whose load this eviction makes room for, whose parked copy must stay for it."""

    def parked(self) -> list[Any]:
        """The parked models (parking.ParkedStatus); [] where nothing parks."""

    def start(self) -> None:
        """Before the first load (helpers, warm-up); may do nothing."""

    def close(self) -> None:
        """After the last unload: stop what `start` started."""
