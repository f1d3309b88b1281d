"""What crosses between the HTTP side and the engine loop, in either mode: small picklable dataclasses.

The engine loop is the one writer of the scheduler, the pool and the sequences; the HTTP side only sends
`AddRequest`, `AbortRequest`, `LoadAdapter` and `UnloadAdapter` and reads `EngineUpdate`s, so no lock crosses
the boundary (docs/architecture.md, "Engine"). Torch-free, so the HTTP side can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flotilla_contract.classes import DEFAULT_CLASS_WEIGHTS

from flotilla_server.engine.outputs import EngineStats, RequestOutput, StepRecord
from flotilla_server.engine.sampling_params import SamplingParams

# A test hook, run in the engine loop after a step is planned and before it executes:
# hook(step_index, wait_for_message) where wait_for_message(timeout_s) -> bool says a message is pending.
# It must be a module-level function: in the process mode it is pickled into the child.
StepHook = Callable[[int, Callable[[float], bool]], None]


class EngineStartError(RuntimeError):
    """The engine could not start; the message says what to change."""


# A request refused because its adapter is not served (unloaded after the HTTP side checked its name): its
# refusal starts so, and its stream ends with this abort reason, answered as the 404 of an unknown model
NOT_SERVED_PREFIX = "the LoRA adapter "
ADAPTER_NOT_SERVED = "adapter_not_served"


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    extra_prompts: list[list[int]] = field(default_factory=list)  # prompts 2.. of a list of prompts

    @property
    def prompts(self) -> list[list[int]]:
        return [self.prompt_token_ids, *self.extra_prompts]


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class LoadAdapter:
    """POST /v1/load_lora_adapter, its path already allowed (http/lora_paths.py): answered by an AdapterReply
    with the same call_id once the adapter is read, or at once (engine/adapter_requests.py)."""

    call_id: str
    name: str
    source: str  # the adapter directory's real path


@dataclass(frozen=True)
class UnloadAdapter:
    """POST /v1/unload_lora_adapter: answered at once; requests already in the engine finish."""

    call_id: str
    name: str


@dataclass(frozen=True)
class AdapterReply:
    """The answer to a LoadAdapter or UnloadAdapter: an HTTP status and what to tell the caller."""

    call_id: str
    status: int  # 200, or 400, 403, 404, 409
    message: str
    param: str | None = None  # the request field the refusal is about


@dataclass(frozen=True)
class Shutdown:
    """The HTTP side is done: the engine loop exits (closing the pipe does the same)."""


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs, apart from what it computes (EngineConfig)."""

    max_overtakes: int | None = None  # later arrivals admitted past a blocked head; None: max_num_seqs
    num_threads: int | None = None  # process mode: torch/OpenMP threads of the engine once loaded; None: inherited
    # process mode: the model loads on a thread of its own, this much nicer and on this many torch threads;
    # the engine loop then runs on the process's main thread, at its own priority and `num_threads`
    # (a multi-model server's load must not starve the resident models: model_cache/engine_processes.py)
    load_nice: int = 0
    load_threads: int | None = None
    log_level: str = "info"
    # measure the thread count a full decode step runs fastest on, on the thread that runs the steps
    # (engine/thread_count.py); for one model on CPU whose count nobody set
    measure_threads: bool = False
    # the admission order between classes and tenants (engine/fair_admission.py); pairs, so they pickle
    class_weights: tuple[tuple[str, float], ...] = tuple(DEFAULT_CLASS_WEIGHTS.items())
    tenant_weights: tuple[tuple[str, float], ...] = ()
    tenant_max_running: int | None = None
    tenant_fairness: bool = False  # on when tenant weights or caps are configured; else FIFO within a class
    served_model_name: str | None = None  # the name clients send for the base model: no adapter may take it
    step_hook: StepHook | None = None  # tests only


@dataclass(frozen=True)
class EngineInfo:
    """Sent once the engine is up: what the HTTP side needs to serve it, and the limits it checks locally."""

    name: str
    tokenizer: Any  # flotilla_server.model.tokenizer.Tokenizer (torch-free, picklable)
    vocab_size: int
    max_model_len: int
    num_slots: int
    num_kv_blocks: int
    block_size: int
    description: str = ""
    is_demonstration: bool = False
    pid: int = 0  # the process running the engine loop
    weight_bytes: int = 0  # every byte of weights held, packed copies included (DecoderModel.weight_bytes)
    quantization: str = "none"  # how they are held: none, or gguf: and the block types (DecoderModel.quantization)
    dtype: str = "float32"  # the activations' and KV cache's (flags.DTYPES): `--dtype auto` chosen
    adapters: tuple[str, ...] = ()  # the LoRA adapters served at start (--lora, then the list file), in order
    max_loras: int = 0  # adapter slots; 0: this engine serves no adapters (no --lora, list file or --lora-dir)


@dataclass(frozen=True)
class EngineFailed:
    """The engine could not start (or died): `message` says what to change."""

    message: str


@dataclass(frozen=True)
class EngineUpdate:
    """What one turn of the engine loop changed: admissions, refusals, tokens, and the state after it."""

    stats: EngineStats
    admitted: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (request_id, why)
    outputs: list[RequestOutput] = field(default_factory=list)
    record: StepRecord | None = None  # set when the turn ran a step
    adapter_replies: list[AdapterReply] = field(default_factory=list)  # answers to LoadAdapter, UnloadAdapter
