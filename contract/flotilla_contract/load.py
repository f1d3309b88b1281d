"""The light load report each server publishes at LOAD_PATH, polled by the gateway several times a second.

It carries what routing needs and nothing else: queue and slot figures, KV usage, whether the server takes
new work, the state of each model it can serve (one for a dedicated server, several in a pool), and its LoRA
adapters: which it serves, which sit in slots, how many slots are free, and which it refused. Every field
added since the first version has a default, so a gateway reads an older server's report as one without them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

LOAD_PATH = "/flotilla/v1/load"
# A multi-model server loads the model named in the path as a request would, without one: POST, answered 202 while
# it loads (200 when it is loaded already). The operator's demotion of an adaptive model asks the pool to load it
# this way before the gateway routes to the pool (docs/autoscaling.md, "Adaptive tiering").
MODEL_LOAD_PATH = "/flotilla/v1/models/{name}/load"
# The gateway names each request's prompt prefix (a hash of its routing key) in this header; a server reports
# back which of those names its prefix cache holds (ServerLoad.prefix_keys), for `prefix` routing.
PREFIX_KEY_HEADER = "X-Flotilla-Prefix-Key"
PREFIX_KEY_MAX_CHARS = 64

ModelState = Literal["loaded", "loading", "available"]


class LastLoad(BaseModel):
    """A pool model's latest load: where its weights came from and where its time went (the phases sum to
    `seconds`)."""

    model_config = ConfigDict(extra="ignore")

    origin: Literal["disk", "parked"] = Field(description=(
        "disk: read from its source; parked: woken from where it was parked when evicted."))
    seconds: float = Field(ge=0.0, description="The whole load, from its start to its engine serving.")
    start_s: float = Field(0.0, ge=0.0, description="Starting (forking) or waking its engine process.")
    read_s: float = Field(0.0, ge=0.0, description="Reading its weights and tokenizer (none when parked on CPU).")
    build_s: float = Field(0.0, ge=0.0, description="Building the engine on them: KV pool, runner, adapters.")
    warmup_s: float = Field(0.0, ge=0.0, description="One one-token request, so the first real one pays no first use.")


class ModelLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    state: ModelState = "loaded"
    waiting: int = Field(0, ge=0, description="Requests waiting for a slot of this model.")
    running: int = Field(0, ge=0, description="Requests of this model holding a slot.")
    last_used_s: float | None = Field(None, description="Seconds since this model last served a request.")
    memory_bytes: int | None = Field(None, ge=0, description="Bytes this model holds (weights and KV pool).")
    max_loras: int = Field(0, ge=0, description="This model's adapter slots while it is loaded; 0: none.")
    adapter_slots_free: int = Field(0, ge=0, description=(
        "Of those, slots not pinned by a running or waiting sequence: an adapter loaded now evicts no pinned one."))
    parked_bytes: int = Field(0, ge=0, description=(
        "Memory it holds parked (evicted, its weights kept outside the budget so that it loads again quickly); "
        "0: not parked."))
    last_load: LastLoad | None = Field(None, description="Its latest load, if it was loaded since the server started.")


class AdapterServed(BaseModel):
    """A LoRA adapter a request may name as `model` on this server."""

    model_config = ConfigDict(extra="ignore")

    name: str
    base: str = Field(description="The model it runs on: the served model, or in a pool its list line's base=.")


class AdapterRefused(BaseModel):
    """An adapter the server was asked to serve and does not: a bad line of --lora-list-file, or an adapter
    that failed to load (the server tries it again); an operator turns these into a Degraded condition."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="The adapter's name as listed ('' when the line gives none).")
    error: str = Field(description="Why, naming the file and line or the adapter, and what to change.")


class SkippedModel(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    source: str
    error: str = Field(description="Why the source cannot be read, and what to change.")


class ModelListReport(BaseModel):
    """A multi-model server's model list file (docs/serving.md, "The model list file")."""

    model_config = ConfigDict(extra="ignore")

    path: str
    reload_failures: int = Field(0, ge=0, description=(
        "Versions of the file refused since start (a bad line, an unreadable file); the list before stayed."))
    last_error: str | None = Field(None, description="Why the latest version was refused; null once a good one is read.")
    skipped: list[SkippedModel] = Field(default_factory=list, description=(
        "Entries of the list in force that are not served: their source cannot be read (each is tried again now and then)."))


class ServerLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ready: bool = Field(description="The server takes new requests (loaded, not draining).")
    waiting: int = Field(ge=0, description="Requests waiting for a slot (admission queue plus preempted).")
    running: int = Field(ge=0, description="Requests holding a slot.")
    slots: int = Field(ge=0, description="Sequences the server runs at once (max_num_seqs, summed over models).")
    queue_capacity: int = Field(ge=0, description="Requests the admission queue holds before answering 429.")
    kv_usage: float = Field(ge=0.0, le=1.0, description="KV-cache blocks used ÷ total.")
    models: list[ModelLoad] = Field(default_factory=list)
    memory_budget_bytes: int | None = Field(None, ge=0, description="A pool server's memory budget.")
    memory_free_bytes: int | None = Field(None, ge=0, description="Budget not held by loaded models.")
    parked_bytes: int | None = Field(None, ge=0, description=(
        "A pool server's parked models' memory, outside the budget (bounded by --parked-memory)."))
    model_list: ModelListReport | None = Field(None, description="A multi-model server's --model-list-file, if any.")
    prefix_keys: list[str] = Field(default_factory=list, description=(
        "Prefix keys (PREFIX_KEY_HEADER values of recent requests) whose prompt blocks the prefix cache holds now, "
        "most recent first."))
    adapters: list[AdapterServed] = Field(default_factory=list, description=(
        "LoRA adapters a request may name as `model` now, each once, with its base."))
    adapters_resident: list[str] = Field(default_factory=list, description="Adapters in a slot now.")
    max_loras: int = Field(0, ge=0, description=(
        "Adapter slots (--max-loras; in a pool, summed over loaded models). 0: the server serves no adapters."))
    adapter_slots_free: int = Field(0, ge=0, description=(
        "Adapter slots not pinned by a running or waiting sequence (summed like max_loras)."))
    adapters_refused: list[AdapterRefused] = Field(default_factory=list, description=(
        "Adapters listed and not served: a refused line or a failed load, each with its error."))
