"""What a pool server's engine process and its parent say to park a model and wake it, and how long a load took.

Torch-free, so the model cache may read them (docs/architecture.md, "Model cache", "Parked models").

The exchange, on the engine's one pipe:
- parent `Park(path)` -> the engine loop ends (as on Shutdown), its KV pool and steps' memory go, the weights
  move to `path` (CPU, memory-mapped) or pinned host memory (GPU) -> child `Parked` (or `EngineFailed`);
- parent `Wake(config, options)` -> the engine is built again on the parked weights and warmed up -> child
  `LoadPhases`, then `EngineInfo` without its tokenizer (the parent kept it: 49k tokens take ~0.1 s to
  pickle and unpickle); `Shutdown` or a closed pipe ends a parked process.
"""

from __future__ import annotations

from dataclasses import dataclass

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.messages import EngineOptions

PHASES = ("read", "build", "warmup")  # a load's phases, in order (LoadPhases fields, metric labels)


@dataclass(frozen=True)
class LoadPhases:
    """Seconds of each phase of an engine's start, measured in the engine process; sent before EngineInfo.
    read: the weights and tokenizer (from the source, or nothing for a parked model on CPU, the copy back to
    the GPU from pinned host memory); build: the engine around them (KV pool, runner, adapters); warmup:
    one one-token request, so that the first real one pays no first-use costs."""

    read_s: float
    build_s: float
    warmup_s: float

    def seconds(self) -> dict[str, float]:
        return {"read": self.read_s, "build": self.build_s, "warmup": self.warmup_s}


@dataclass(frozen=True)
class Park:
    path: str  # the parked file to write on CPU (its folder exists); unused on a GPU


@dataclass(frozen=True)
class Parked:
    weight_bytes: int  # the weights parked: the parked file's size (CPU) or pinned host bytes (GPU)
    anonymous_bytes: int  # what the parked process holds beside them (private anonymous memory): heap, tokenizer
    path: str | None  # the parked file; None on a GPU


@dataclass(frozen=True)
class Wake:
    config: EngineConfig  # as for a first start: the thread share and adapters may differ from the last one
    options: EngineOptions
