"""EngineLoop: the engine's one writer. It owns the core (scheduler, pool, sequences) and the admission queue.

Both modes run this same loop: in the engine process (engine/process_main.py) it reads its inbox from a
pipe; in the in-process mode (engine/backends.py) from a queue, on a thread. Either way a message is
applied only between steps, never between a step's plan and its execution: an abort can no longer free
the blocks a forward pass is about to read (docs/architecture.md, "Engine").

LoRA adapters: a request names its adapter; on arrival the name becomes the adapter's key (engine/
adapter_cache.py), so a request admitted before an unload runs to its end with the adapter it named. Runtime
loads and unloads, and the list file, go through engine/adapter_service.py; after each turn, unloaded
adapters that no sequence or queued request uses are dropped.

The admission queue lives here, next to the state it decides on: waiters are admitted by weighted fair
queuing between classes and tenants, by priority and ticket within them, with bounded overtaking
(engine/fair_admission.py), whenever a turn may have freed capacity. Its bound and each waiter's wait
budget are kept by the HTTP side, which answers 429 without asking the engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from flotilla_contract.classes import INTERACTIVE, REQUEST_CLASSES

from flotilla_server.engine.adapter_service import AdapterService
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.core import EngineCore
from flotilla_server.engine.fair_admission import FairAdmissionPolicy, FairnessConfig
from flotilla_server.engine.messages import (
    AbortRequest,
    AddRequest,
    EngineInfo,
    EngineOptions,
    EngineUpdate,
    LoadAdapter,
    Shutdown,
    UnloadAdapter,
)
from flotilla_server.engine.outputs import StepRecord
from flotilla_server.model import LoadedModel

log = logging.getLogger(__name__)

Message = AddRequest | AbortRequest | LoadAdapter | UnloadAdapter | Shutdown
GRAMMAR_POLL_S = 0.002  # an idle engine's check on grammars being built


class Inbox(Protocol):
    """Where the loop's messages come from. `wait` returns at once when the other side is gone."""

    def wait(self, timeout_s: float | None) -> bool: ...  # True: a message (or the end) is ready

    def get(self) -> Message: ...  # only after wait() said True; raises EOFError when the other side is gone


@dataclass(eq=False)  # hashed by identity: the policy keys its tickets by waiter
class _Waiter:
    request: AddRequest


class EngineLoop:
    def __init__(self, core: EngineCore, options: EngineOptions) -> None:
        self.core = core
        self.options = options
        max_overtakes = core.config.max_num_seqs if options.max_overtakes is None else options.max_overtakes
        # unbounded here: the HTTP side bounds the queue (an exact count, and 429 without a round trip)
        self._policy: FairAdmissionPolicy[_Waiter] = FairAdmissionPolicy(FairnessConfig(
            class_weights=dict(options.class_weights), tenant_weights=dict(options.tenant_weights),
            tenant_max_running=options.tenant_max_running, tenant_fairness=options.tenant_fairness,
            max_overtakes=max_overtakes,
        ))
        self._waiting: dict[str, _Waiter] = {}
        self._building: dict[str, AddRequest] = {}  # requests whose grammar is being built, in arrival order
        self._queued_by_class = dict.fromkeys(REQUEST_CLASSES, 0)  # self._waiting, counted as it changes
        self._refused: list[tuple[str, str]] = []
        self._dirty = False  # state changed since the last update (an abort, an arrival)
        self._steps = 0
        self._record: StepRecord | None = None
        core.add_step_listener(self._on_step)
        c = core.config
        self.adapters = AdapterService(
            core.adapters, core.loaded.config, c.max_lora_rank, runtime_loads=c.lora_runtime_loads,
            reserved=(options.served_model_name or core.loaded.name,), flag_names=[name for name, _ in c.loras],
            list_file=core.lora_list,
            listed=core.lora_listed)
        self._lora_info: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        self._lora_info_s = time.time()

    def info(self, pid: int) -> EngineInfo:
        loaded = self.core.loaded
        return EngineInfo(
            name=loaded.name, tokenizer=loaded.tokenizer, vocab_size=loaded.config.vocab_size,
            max_model_len=self.core.max_model_len, num_slots=self.core.config.max_num_seqs,
            num_kv_blocks=self.core.pool.num_blocks, block_size=self.core.pool.block_size,
            description=loaded.description, is_demonstration=loaded.is_demonstration, pid=pid,
            weight_bytes=loaded.model.weight_bytes(), quantization=loaded.model.quantization(),
            dtype=str(loaded.model.compute_dtype).removeprefix("torch."),
            adapters=tuple(self.core.adapters.served) if self.core.adapters is not None else (),
            max_loras=self.core.adapters.slots.max_loras if self.core.adapters is not None else 0,
        )

    def _on_step(self, record: StepRecord) -> None:
        self._record = record

    # --- messages (between steps only) ------------------------------------------------------------

    def apply(self, message: Message) -> None:
        self._dirty = True
        if isinstance(message, AddRequest):
            rid = message.request_id
            why = next((w for p in message.prompts
                        if (w := self.core.check_feasible(len(p), message.params.max_tokens, message.params.n))), None)
            if why is None and message.params.lora is not None:
                key = self.core.adapters.key_of(message.params.lora) if self.core.adapters is not None else None
                if key is None:
                    why = self.core.not_served(message.params.lora)
                else:
                    message = replace(message, params=replace(message.params, lora=key))
            if why is None and (rid in self._waiting or rid in self._building):
                why = f"request id {rid!r} is already in use"
            if why is None and message.params.is_batch:
                why = self._batch_infeasible(message.params.n)
            if why is not None:
                self._refused.append((rid, why))
            elif self.core.grammar_ready(message.params):
                self._enqueue(message)
            else:  # queued once its grammar is built, on the grammar threads: no step waits for it
                self._building[rid] = message
        elif isinstance(message, LoadAdapter):
            self.adapters.load(message)
        elif isinstance(message, UnloadAdapter):
            self.adapters.unload(message)
        elif isinstance(message, AbortRequest):
            waiter = self._waiting.pop(message.request_id, None)
            if waiter is not None:
                self._queued_by_class[waiter.request.params.request_class] -= 1
                self._policy.remove(waiter)
            elif self._building.pop(message.request_id, None) is None:
                self.core.abort(message.request_id)

    def _enqueue(self, message: AddRequest) -> None:
        waiter, p = _Waiter(message), message.params
        self._waiting[message.request_id] = waiter
        self._queued_by_class[p.request_class] += 1
        self._policy.push(waiter, request_class=p.request_class, tenant=p.tenant, priority=p.priority, num_slots=p.n)

    def _grammars_built(self) -> None:
        for rid, message in list(self._building.items()):
            if self.core.grammar_ready(message.params):
                del self._building[rid]
                self._enqueue(message)
                self._dirty = True

    def _batch_infeasible(self, n: int) -> str | None:
        slots, reserve = self.core.config.max_num_seqs, self.core.config.interactive_reserve_slots
        if n <= slots - reserve:
            return None
        return (f"n is {n}, but batch requests hold at most {slots - reserve} slots ({reserve} of the {slots} are "
                f"kept for interactive work, --interactive-reserve-slots): lower n or send the request as interactive")

    def _try_admit(self, waiter: _Waiter) -> bool:
        r = waiter.request
        try:
            admitted = self.core.try_admit(r.request_id, r.prompt_token_ids, r.params, r.extra_prompts) is None
        except ValueError as e:  # an id still in use by a running request
            self._refused.append((r.request_id, str(e)))
            admitted = True  # leaves the queue
        if admitted:
            del self._waiting[r.request_id]
            self._queued_by_class[r.params.request_class] -= 1
        return admitted

    # --- one turn -----------------------------------------------------------------------------------

    def has_work(self) -> bool:
        # a waiter with nothing running always fits (a feasible request alone needs no reserve): no busy loop
        return self.core.has_unfinished() or bool(self._waiting)

    def idle_wait_s(self) -> float | None:
        """How long to wait for a message when there is no work: until one comes, or a short poll while a
        grammar builds (its request then joins the queue) or an adapter is read, or the list file's next check."""
        waits = [w for w in (GRAMMAR_POLL_S if self._building else None, self.adapters.idle_wait_s()) if w is not None]
        return min(waits, default=None)

    def turn(self, wait_for_message: Callable[[float], bool]) -> EngineUpdate | None:
        """Admit whoever fits, run one step if anything runs; None if nothing changed."""
        scheduler = self.core.scheduler
        if self._building:
            self._grammars_built()
        scheduler.readmit()  # preempted sequences first: else constant arrivals would keep them out
        free_slots = scheduler.max_num_seqs - scheduler.num_slots_used
        running_by_tenant = scheduler.requests_by_tenant() if self.options.tenant_fairness else {}
        batch_slots = scheduler.rules.batch_room(scheduler.running, scheduler.max_num_seqs)
        taken = [w.request.request_id for w in self._policy.admit_round(
            self._try_admit, free_slots=free_slots, running_by_tenant=running_by_tenant, batch_slots=batch_slots)]
        scheduler.interactive_waiting = self._policy.has_waiting(INTERACTIVE)
        refused = {rid for rid, _ in self._refused}
        admitted = [rid for rid in taken if rid not in refused]
        outputs = []
        self._record = None
        if self.core.has_unfinished():
            hook = self.options.step_hook
            index = self._steps
            self._steps += 1
            after = (lambda: hook(index, wait_for_message)) if hook is not None else None
            outputs = self.core.step(after_schedule=after)
        replies = self.adapters.turn()
        self._dirty |= self.adapters.changed  # every HTTP process hears of the adapters served now
        self.adapters.changed = False
        keys = self._adapter_keys() if self.core.adapters is not None else None
        if keys is not None:
            self._dirty |= bool(self.core.adapters.release(keys[0] | keys[1]))  # type: ignore[union-attr]
        if not (admitted or outputs or self._record or self._dirty or replies):
            return None
        stats = replace(self.core.stats(), queued_by_class=dict(self._queued_by_class), **self._lora_stats(keys))
        update = EngineUpdate(stats, admitted, self._refused, outputs, self._record, replies)
        self._refused = []
        self._dirty = False
        return update

    # --- adapters ---------------------------------------------------------------------------------

    def _adapter_keys(self) -> tuple[set[str], set[str]]:
        """The adapter keys of sequences running, and of those waiting in the engine or in this loop's queue."""
        scheduler = self.core.scheduler
        running = {s.params.lora for s in scheduler.running if s.params.lora is not None}
        waiting = {s.params.lora for s in scheduler.waiting if s.params.lora is not None}
        waiting |= {r.params.lora for r in (*(w.request for w in self._waiting.values()), *self._building.values())
                    if r.params.lora is not None}
        return running, waiting

    def _lora_stats(self, keys: tuple[set[str], set[str]] | None) -> dict:
        """The adapters running and waiting, by name, and when either set last changed (vllm:lora_requests_info)."""
        cache = self.core.adapters
        if cache is None or keys is None:
            return {}
        running, waiting = keys
        info = (tuple(sorted({cache.names[k] for k in running})), tuple(sorted({cache.names[k] for k in waiting})))
        if info != self._lora_info:
            self._lora_info, self._lora_info_s = info, time.time()
        return {"adapters_running": info[0], "adapters_waiting": info[1], "adapters_changed_s": self._lora_info_s,
                "adapters_refused": self.adapters.refused()}

    def close(self) -> None:
        self.adapters.close()
        self.core.close()


def serve_inbox(loop: EngineLoop, inbox: Inbox, send: Callable[[EngineUpdate], None]) -> None:
    """Run until Shutdown or the other side is gone (EOFError from the inbox is the caller's to handle)."""
    while True:
        if inbox.wait(0 if loop.has_work() else loop.idle_wait_s()):
            while True:
                message = inbox.get()
                if isinstance(message, Shutdown):
                    loop.close()
                    return
                loop.apply(message)
                if not inbox.wait(0):
                    break
        update = loop.turn(inbox.wait)
        if update is not None:
            send(update)


def build_loop(config: EngineConfig, options: EngineOptions, loaded: LoadedModel | None = None) -> EngineLoop:
    return EngineLoop(EngineCore(config, loaded), options)
