"""What a runtime adapter load or unload does (policy), apart from the reading and the replies that carry it
out (engine/adapter_service.py): pure functions of the names served and being read, tested on tables.

Rules (docs/serving.md, "LoRA adapters"):
- a load of a name nobody serves or reads starts a read; a name the base model is served under is refused
  (400: a request naming it would be ambiguous);
- a load of a name already served from the same directory is answered at once with success (idempotent: a
  controller may repeat its calls); from another directory it is a 409 (unload it first). vLLM answers
  both with a 400 "already loaded";
- a load of a name being read from the same directory joins that read: two concurrent loads of one name
  read it once and get the same answer; from another directory it is a 409;
- an unload of a served name stops new requests naming it at once; those already in the engine finish (the
  adapter cache keeps it until then); an unknown name is a 404, one still being read a 409.
Sources are compared as the caller resolved them (real paths).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass


class LoadStep(enum.Enum):
    START = "start"  # read the adapter
    JOIN = "join"  # answer with the read already running
    ANSWER = "answer"  # answer now (status, message)


@dataclass(frozen=True)
class Decision:
    step: LoadStep
    status: int = 200
    message: str = ""
    param: str | None = None


def decide_load(name: str, source: str, served: Mapping[str, str], reading: Mapping[str, str],
                reserved: Collection[str]) -> Decision:
    """`served`, `reading`: name -> real source of the adapters served and being read; `reserved`: the names
    the base model answers to."""
    if name in reserved:
        return Decision(LoadStep.ANSWER, 400, f"The adapter name {name!r} is the served model's name: a request "
                        "naming it would be ambiguous; choose another lora_name.", "lora_name")
    if name in served:
        if served[name] == source:
            return Decision(LoadStep.ANSWER, 200, f"Success: LoRA adapter '{name}' is already loaded from {source}.")
        return Decision(LoadStep.ANSWER, 409, f"The LoRA adapter {name!r} is already loaded from {served[name]}: "
                        "unload it first (POST /v1/unload_lora_adapter), or load this one under another name.",
                        "lora_name")
    if name in reading:
        if reading[name] == source:
            return Decision(LoadStep.JOIN)
        return Decision(LoadStep.ANSWER, 409, f"The LoRA adapter {name!r} is being loaded from {reading[name]}: "
                        "wait for that load's answer, or load this one under another name.", "lora_name")
    return Decision(LoadStep.START)


def decide_unload(name: str, served: Collection[str], reading: Collection[str]) -> Decision:
    if name in served:
        return Decision(LoadStep.ANSWER, 200, f"Success: LoRA adapter '{name}' removed successfully.")
    if name in reading:
        return Decision(LoadStep.ANSWER, 409, f"The LoRA adapter {name!r} is still loading: unload it once its "
                        "load has answered.", "lora_name")
    return Decision(LoadStep.ANSWER, 404, f"The LoRA adapter {name!r} is not loaded here (see GET /v1/models).",
                    "lora_name")
