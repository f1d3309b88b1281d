"""What every request handler shares: the engine, the tokenizer, the admission queue, metrics, drain state.

Held in ``app.state.flotilla``; handlers reach it through the ``State`` dependency alias.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request

from flotilla_server.engine.client import EngineClient
from flotilla_server.http.admission import AdmissionQueue
from flotilla_server.http.door_traffic import DoorTraffic
from flotilla_server.http.metrics import ServerMetrics, StateSnapshot
from flotilla_server.http.structured import Grammars, StructuredSettings


class PromptTokenizer(Protocol):
    """What the routes need of the model's tokenizer (flotilla_server.model.tokenizer.Tokenizer)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class ServedModel:
    """The loaded model as the HTTP layer sees it: names and limits, no weights."""

    name: str  # what clients send as `model`
    tokenizer: PromptTokenizer
    vocab_size: int
    max_model_len: int
    description: str = ""
    is_demonstration: bool = False
    weight_bytes: int = 0  # the weights held, packed copies included
    quantization: str = "none"  # how: none, or gguf: and the block types
    adapters: tuple[str, ...] = ()  # LoRA adapters served on it (--lora names): each also a `model` clients send


@dataclass(eq=False)
class ServerState:
    engine: EngineClient
    tokenizer: PromptTokenizer
    served_model_name: str
    max_model_len: int
    vocab_size: int
    admission: AdmissionQueue
    model_description: str = ""  # shown in /v1/models; says "DEMONSTRATION model" for tiny
    model_weight_bytes: int = 0  # shown in /v1/models and as a gauge
    model_quantization: str = "none"
    lora_dirs: tuple[str, ...] = ()  # where POST /v1/load_lora_adapter may read (--lora-dir); none: the API is off
    metrics: ServerMetrics = field(init=False)
    created_s: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    ready: bool = False
    door_limit: int = 0  # door tickets + waiters allowed: queue depth + slots (set at construction)
    at_door: int = 0  # requests past the load shedder that have not reached the queue yet
    door_traffic: DoorTraffic = field(default_factory=DoorTraffic)  # requests let in wait for a quiet door
    in_flight: int = 0  # requests past the drain check and not yet answered (queued or running)
    live: set[str] = field(default_factory=set)  # admitted requests whose outcome is not yet counted
    slow_clients: set[str] = field(default_factory=set)  # live requests the engine cut off as slow_client
    # several HTTP processes (flotilla_server/fronts.py): this one's share of the slots, and the whole queue's capacity;
    # the gauges and the load report then count the engine's queue, which holds every process's waiters
    front_slots: int | None = None
    shared_queue_capacity: int | None = None
    structured: StructuredSettings = field(default_factory=StructuredSettings)  # grammars' limits, tool parser
    grammars: Grammars = field(init=False)  # the compile gate, started by the first grammar (http/structured.py)
    _idle: asyncio.Event | None = None

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.served_model_name, self.snapshot)
        info = getattr(self.engine, "info", None)
        if info is not None and info.max_loras:
            self.metrics.serve_adapters(self.engine.stats, info.max_loras)
        self.grammars = Grammars(self.structured, self.tokenizer, self.vocab_size, self.metrics)  # type: ignore[arg-type]
        slots = self.engine.stats().num_slots if self.front_slots is None else self.front_slots
        self.door_limit = self.admission.depth + slots

    @property
    def adapters(self) -> tuple[str, ...]:
        """LoRA adapter names a request may send as `model` now: the engine's after its last turn, so that a
        load or unload through any HTTP process shows in all (http/routes/adapters.py)."""
        return self.engine.stats().adapters_served

    @property
    def max_loras(self) -> int:
        """The engine's adapter slots; 0: it serves no adapters (the load report's max_loras)."""
        info = getattr(self.engine, "info", None)
        return int(getattr(info, "max_loras", 0) or 0)

    @property
    def queue_capacity(self) -> int:
        return self.admission.depth if self.shared_queue_capacity is None else self.shared_queue_capacity

    def queued_by_class(self) -> dict[str, int]:
        """Requests waiting for admission, by class: this process's exact count, or with several HTTP
        processes the engine's count of them all after its last turn."""
        if self.shared_queue_capacity is None:
            return self.admission.waiting_by_class()
        return dict(self.engine.stats().queued_by_class)

    def snapshot(self) -> StateSnapshot:
        s = self.engine.stats()
        queued = self.queued_by_class()
        return StateSnapshot(
            waiting_by_class={c: n + s.waiting_by_class.get(c, 0) for c, n in queued.items()},
            running_by_class=s.running_by_class,
            preemptions_by_class=s.preemptions_by_class,
            requests_waiting=sum(queued.values()) + s.num_waiting,
            requests_running=s.num_running,
            slots=s.num_slots,
            kv_blocks_total=s.kv_blocks_total,
            kv_blocks_used=s.kv_blocks_used,
            preemptions=s.num_preemptions,
            kv_blocks_cached=s.kv_blocks_cached,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            weight_bytes=self.model_weight_bytes,
            quantization=self.model_quantization,
            spec_drafts=s.spec_drafts if s.speculating else None,
            spec_proposed_tokens=s.spec_proposed_tokens,
            spec_accepted_tokens=s.spec_accepted_tokens,
        )

    @property
    def accepting(self) -> bool:
        """The one readiness rule: loaded, the engine alive, and not draining (/readyz and the load report)."""
        return self.ready and self.engine.alive and not self.draining

    def on_abort(self, request_id: str, reason: str) -> None:
        """Engine abort hook: counts a slow client once, when its stream overflows (the handler may be stuck
        sending to that very client and cannot count it)."""
        if reason == "slow_client" and request_id in self.live and request_id not in self.slow_clients:
            self.slow_clients.add(request_id)
            self.metrics.count_rejection("slow_client")

    def cut_off(self, reason: str) -> None:
        """Abort every live request (drain timeout); their streams end with an error chunk."""
        for request_id in list(self.live):
            self.engine.abort(request_id, reason)

    def enter(self) -> None:
        self.in_flight += 1
        if self._idle is not None:
            self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        assert self.in_flight >= 0
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True if every in-flight request finished within timeout_s."""
        if self._idle is None:
            self._idle = asyncio.Event()
        if self.in_flight == 0:
            return True
        self._idle.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False


def _state(request: Request) -> ServerState:
    return request.app.state.flotilla


State = Annotated[ServerState, Depends(_state)]
