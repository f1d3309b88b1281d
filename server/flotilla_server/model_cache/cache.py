"""The model cache of a multi-model server: which models are loaded, one load worker, eviction by policy.

Requests reach a model through `acquire` (on the event loop) and give it back with `release`; a model with
holders is busy and never evicted. Loads run one at a time on one worker thread, so the event loop never
waits on a load; the heavy part (reading weights) is the engines' business, and engine_processes.py does
it in the new model's own process, niced and on one thread, so resident models keep their CPU. The worker
itself is not niced: it holds the GIL of the HTTP side now and then. What to evict is `policy.decide_load`'s
answer, never decided here (docs/architecture.md, "Model cache"). Engines are started and stopped only
through `engines.Engines`; an engine that dies by itself sends its model back to `available`.

LoRA adapters ride on their base (specs.fold): the base's footprint counts them, its load starts its engine
with them, and a request naming an adapter acquires the base (`base_of`). When the list changes a loaded
base's adapters, the change goes to its engine (`hooks.adapters_changed`: the HTTP side sends the engine's
LoadAdapter and UnloadAdapter); a base loaded without adapters has no slots, so it is reloaded once idle.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from flotilla_server.model_cache.engines import Engines, ModelEngine
from flotilla_server.model_cache.membership import ListStatus, Membership, Skipped
from flotilla_server.model_cache.policy import Action, Resident, decide_load
from flotilla_server.model_cache.specs import ModelSpec
from flotilla_server.model_cache.status import (
    AVAILABLE,
    LOADED,
    LOADING,
    CacheHooks,
    Infeasible,
    LoadFailed,
    LoadRecord,
    LoadTimeout,
    ModelStatus,
    UnknownModel,
)
from flotilla_server.model_cache.threads import most_resident

log = logging.getLogger("flotilla.model_cache")

_IDLE_WAIT_S = 1.0  # the worker re-checks the list file and waiting loads at least this often

@dataclass(eq=False)
class _Entry:
    spec: ModelSpec
    footprint_bytes: int
    state: str = AVAILABLE
    handle: ModelEngine | None = None
    loaded_at_s: float = 0.0
    last_used_s: float = 0.0  # monotonic; 0: never used
    users: int = 0  # requests holding the model or waiting for its load
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = field(default_factory=list)
    listed: bool = True  # still in the flags or the list file
    served_adapters: dict[str, str] = field(default_factory=dict)  # what its engine was given: name -> source
    reload_when_idle: bool = False  # listed adapters its engine has no slots for: unload it once idle
    last_load: LoadRecord | None = None


class ModelCache:
    def __init__(self, engines: Engines, specs: tuple[ModelSpec, ...], budget_bytes: int, min_residency_s: float,
                 list_file: str | None = None, hooks: CacheHooks | None = None,
                 clock: Callable[[], float] = time.monotonic, skip_unreadable_at_start: bool = False) -> None:
        self.engines = engines
        self.budget_bytes = budget_bytes
        self.min_residency_s = min_residency_s
        self.hooks = hooks or CacheHooks()
        self._clock = clock
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self._adapter_bases: dict[str, str] = {}  # a listed adapter -> its base model
        self._pending: list[str] = []  # loads asked for, oldest first
        self._stop = False
        self._thread: threading.Thread | None = None
        # ValueError (one line) for a list file that cannot be read, or sources that refuse the start
        self._members = Membership(specs, list_file, skip_unreadable_at_start)
        self._members.check_start(self._set_specs(self._members.specs))

    # --- membership (membership.py decides what is listed; here, what it costs) -----------------

    def _set_specs(self, specs: tuple[ModelSpec, ...]) -> list[Skipped]:
        """Register new names, forget unlisted idle ones; returns those whose source cannot be read."""
        wanted = {s.name: s for s in specs}
        with self._cond:  # new or changed while unloaded, or only its adapters changed (any state: no reload)
            new = [s for s in specs if (e := self._entries.get(s.name)) is None or (e.spec != s and e.state == AVAILABLE)
                   or (e.spec != s and e.spec.weights == s.weights)]
        footprints, skipped = {}, []
        for spec in new:  # outside the lock: a GGUF's metadata takes a tenth of a second to read
            try:
                footprints[spec.name] = self.engines.footprint_bytes(spec.source, spec.quantization, spec.adapters)
            except (ValueError, OSError) as e:  # this entry is not served; the others are
                skipped.append(Skipped(spec.name, spec.source, str(e)))
        # a refused new source unlists the old one; a refused adapter keeps its base as it was
        refused = {s.name for s in skipped
                   if (e := self._entries.get(s.name)) is None or e.spec.weights != wanted[s.name].weights}
        adapters_changed = []
        with self._cond:
            for name, spec in wanted.items():
                entry = self._entries.get(name)
                if entry is not None and entry.spec == spec:
                    entry.listed = True
                elif entry is not None and entry.spec.weights == spec.weights:
                    entry.listed = True
                    if name in footprints:
                        entry.spec, entry.footprint_bytes = spec, footprints[name]
                        adapters_changed.append(name)
                elif entry is not None and entry.state != AVAILABLE:
                    log.warning("model %s: source changed to %s; it is used after its unload", name, spec.source)
                elif name in footprints:
                    self._entries[name] = _Entry(spec, footprints[name])
            for name, entry in list(self._entries.items()):
                if name not in wanted or name in refused:
                    entry.listed = False
                    if entry.state == AVAILABLE and entry.users == 0:
                        del self._entries[name]
            self._adapter_bases = {adapter: name for name, e in self._entries.items() if e.listed
                                   for adapter, _ in e.spec.adapters}
            self._cond.notify_all()
        for name in adapters_changed:
            self._sync_adapters(name)
        return skipped

    def _sync_adapters(self, name: str) -> None:
        """Bring a loaded model's engine to its listed adapters: unloads and loads through the hook, or, for
        an engine started without adapter slots, a reload once idle. A loading model is synced once loaded."""
        with self._cond:
            entry = self._entries.get(name)
            if entry is None or entry.state != LOADED or entry.handle is None:
                return
            handle, want, have = entry.handle, dict(entry.spec.adapters), entry.served_adapters
            if want and not handle.adapter_slots:
                entry.reload_when_idle = True
                self._cond.notify_all()
                return
            unloads = tuple(n for n, source in have.items() if want.get(n) != source)
            loads = tuple((n, source) for n, source in want.items() if have.get(n) != source)
            entry.served_adapters = want
        if unloads or loads:
            log.info("model %s: adapters %s unloaded, %s loaded (the model list changed)", name,
                     ", ".join(unloads) or "none", ", ".join(n for n, _ in loads) or "none")
            self.hooks.adapters_changed(name, handle, unloads, loads)

    def _refresh_list(self, force: bool = False) -> None:
        specs = self._members.poll(self._clock(), force)
        if specs is not None:
            self._members.record_skipped(self._set_specs(specs))

    def check_list_now(self) -> None:
        """Read the list file now if it changed (tests; the worker does it every membership.LIST_POLL_S)."""
        self._refresh_list(force=True)

    def list_status(self) -> ListStatus | None:
        """The model list file's state (None without one): refused versions, skipped entries."""
        return self._members.status()

    def base_of(self, name: str) -> str | None:
        """The base model of a listed LoRA adapter; None for any other name."""
        with self._cond:
            return self._adapter_bases.get(name)

    def adapters(self) -> list[tuple[str, str]]:
        """Every listed adapter as (name, its base), in list order."""
        with self._cond:
            return list(self._adapter_bases.items())

    def skipped_reason(self, name: str) -> str | None:
        """Why a listed model is not served (its source cannot be read), or None."""
        skipped = self._members.skipped.get(name)
        return skipped.error if skipped is not None else None

    # --- requests (event loop) ------------------------------------------------------------------

    async def acquire(self, name: str, timeout_s: float) -> ModelEngine:
        """The model's engine, loading it first if needed; pair every success with `release(name)`.
        Raises UnknownModel, Infeasible (never fits), LoadTimeout or LoadFailed."""
        loop = asyncio.get_running_loop()
        with self._cond:
            entry = self._entries.get(name)
            if entry is None or not entry.listed:
                raise UnknownModel(name)
            if entry.footprint_bytes > self.budget_bytes:
                raise Infeasible(name)
            entry.users += 1
            entry.last_used_s = self._clock()
            if entry.state == LOADED and entry.handle is not None:
                return entry.handle
            future: asyncio.Future = loop.create_future()
            entry.waiters.append((loop, future))
            if entry.state == AVAILABLE and name not in self._pending:
                self._pending.append(name)
                self._cond.notify_all()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            self.release(name)
            raise LoadTimeout(name) from None
        except BaseException:
            self.release(name)
            raise

    def release(self, name: str) -> None:
        with self._cond:
            entry = self._entries.get(name)
            if entry is None:
                return
            entry.users -= 1
            assert entry.users >= 0, name
            entry.last_used_s = self._clock()
            entry.waiters = [(lp, f) for lp, f in entry.waiters if not f.done()]
            if entry.users == 0 and name in self._pending:
                self._pending.remove(name)  # nobody waits for it any more
            self._cond.notify_all()

    def is_loaded(self, name: str) -> bool:
        with self._cond:
            entry = self._entries.get(name)
            return entry is not None and entry.state == LOADED

    def footprint_bytes(self, name: str) -> int | None:
        entry = self._entries.get(name)
        return entry.footprint_bytes if entry is not None and entry.listed else None

    def names(self) -> list[str]:
        with self._cond:
            return [n for n, e in self._entries.items() if e.listed]

    def status(self) -> list[ModelStatus]:
        now = self._clock()
        parked = {p.name: p.bytes for p in self.parked()}
        with self._cond:
            # a load queued behind another counts as loading: the pod will hold the model, so a router must
            # send its next requests here rather than start a second load elsewhere
            return [ModelStatus(n, LOADING if n in self._pending else e.state, self._held(e), e.footprint_bytes,
                                e.users, now - e.last_used_s if e.last_used_s else None, e.last_load,
                                parked.get(n, 0) if e.state == AVAILABLE else 0)
                    for n, e in self._entries.items() if e.listed or e.state != AVAILABLE]

    def parked(self) -> list:
        """The parked models (model_cache/parking.ParkedStatus): evicted, their weights kept outside the budget."""
        return self.engines.parked()

    def handles(self) -> list[ModelEngine]:
        with self._cond:
            return [e.handle for e in self._entries.values() if e.handle is not None]

    @staticmethod
    def _held(e: _Entry) -> int:
        if e.state == LOADED and e.handle is not None:
            return e.handle.memory_bytes
        return e.footprint_bytes if e.state == LOADING else 0

    def used_bytes(self) -> int:
        with self._cond:
            return sum(self._held(e) for e in self._entries.values())

    # --- the load worker ------------------------------------------------------------------------

    def start(self) -> None:
        self.engines.start()
        self._thread = threading.Thread(target=self._run, name="flotilla-model-loader", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 30.0, close_engines: bool = True) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for handle in self.handles():
            handle.engine.shutdown()
        if close_engines:
            self.engines.close()

    def _run(self) -> None:
        while True:
            self._refresh_list()
            with self._cond:
                if self._stop:
                    return
                unlisted = self._take_unlisted()
            for name in unlisted:
                self._evict(name)
            with self._cond:
                work = self._next_load()
                if work is None:
                    self._cond.wait(_IDLE_WAIT_S)
                    continue
                name, victims, wait_s = work
                if wait_s is not None:
                    self._cond.wait(min(wait_s, _IDLE_WAIT_S) if wait_s > 0 else _IDLE_WAIT_S)
                    continue
            for victim in victims:
                self._evict(victim, loading=name)
            self._load(name)

    def _next_load(self) -> tuple[str, tuple[str, ...], float | None] | None:
        """Under the lock: the oldest pending load and its victims, or a wait (seconds) before asking again."""
        if not self._pending:
            return None
        name = self._pending[0]
        entry = self._entries[name]
        residents = [Resident(n, self._held(e), e.loaded_at_s, e.last_used_s, e.users > 0 or e.state == LOADING)
                     for n, e in self._entries.items() if e.state != AVAILABLE]
        d = decide_load(entry.footprint_bytes, residents, self.budget_bytes, self._clock(), self.min_residency_s)
        if d.action == Action.LOAD:
            self._pending.pop(0)
            entry.state = LOADING
            for victim in d.evict:
                self._entries[victim].state = AVAILABLE  # no new holder may take it from here on
            return name, d.evict, None
        if d.action == Action.REFUSE:  # acquire refuses these first; the budget cannot shrink
            self._pending.pop(0)
            self._fail(entry, LoadFailed(f"{name} is larger than the memory budget"))
            return None
        return name, (), d.retry_after_s if d.retry_after_s is not None else 0.0

    def _take_unlisted(self) -> list[str]:
        """Under the lock: loaded models gone from the list, or waiting to reload with adapters, and idle,
        marked for unloading."""
        names = [n for n, e in self._entries.items()
                 if (not e.listed or e.reload_when_idle) and e.state == LOADED and e.users == 0]
        for name in names:
            self._entries[name].state = AVAILABLE
            self._entries[name].reload_when_idle = False
        return names

    def _evict(self, name: str, loading: str | None = None) -> None:
        with self._cond:
            entry = self._entries[name]
            handle, entry.handle = entry.handle, None
            listed = entry.listed
            if not entry.listed and entry.users == 0:
                del self._entries[name]
        if handle is None:
            return
        log.info("evicting model %s (%d bytes)", name, handle.memory_bytes)
        self.hooks.evicting(name)
        self.engines.unload(handle, park=listed, loading=loading)  # a model gone from the list is not parked
        del handle
        self.hooks.evicted(name)

    def _load(self, name: str) -> None:
        entry = self._entries[name]
        log.info("loading model %s from %s", name, entry.spec.source)
        start_s = time.monotonic()
        try:
            adapters = entry.spec.adapters
            handle = self.engines.load(name, entry.spec.source, self._models_at_once(), entry.spec.quantization,
                                       adapters)
        except Exception as e:  # a broken model must fail its requests, never the worker
            log.exception("model %s failed to load", name)
            with self._cond:
                entry.state = AVAILABLE
                self._fail(entry, LoadFailed(f"{name} failed to load: {e}"))
            return
        load_s = time.monotonic() - start_s
        p = handle.phases
        record = LoadRecord(handle.origin, load_s, *((p.read_s, p.build_s, p.warmup_s) if p is not None else ()))
        self.hooks.load_seconds(load_s)
        self.hooks.loaded(name, record)
        log.info("model %s loaded in %.2f s from %s (start %.2f s, read %.2f s, build %.2f s, warm-up %.2f s; %d "
                 "bytes; engine process %d)", name, load_s, record.origin, record.start_s, record.read_s,
                 record.build_s, record.warmup_s, handle.memory_bytes, handle.engine.pid)
        with self._cond:
            entry.handle, entry.state, entry.last_load = handle, LOADED, record
            entry.served_adapters = dict(adapters)
            entry.loaded_at_s = self._clock()
            waiters, entry.waiters = entry.waiters, []
            self._cond.notify_all()
        handle.engine.add_death_listener(partial(self._engine_died, name, handle))
        if not handle.engine.alive:  # it died before the listener was there
            self._engine_died(name, handle, "the engine stopped right after its start")
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future, handle, None)
        self._sync_adapters(name)  # the list may have changed its adapters during the load

    def _engine_died(self, name: str, handle: ModelEngine, what: str) -> None:
        """Death listener (the dead engine's reader thread). Its requests have already failed (engine_error);
        the model goes back to `available`, so its memory leaves the budget and its next request loads it
        again. An engine that was being unloaded is not told of its own end (EngineClient.shutdown)."""
        with self._cond:
            entry = self._entries.get(name)
            if entry is None or entry.handle is not handle:
                return  # already unloaded, or told twice
            entry.handle, entry.state = None, AVAILABLE
            if not entry.listed and entry.users == 0:
                del self._entries[name]
            self._cond.notify_all()
        log.error("model %s: its engine stopped (%s); its requests in flight failed, its %d bytes left the "
                  "memory budget, and its next request loads it again", name, what, handle.memory_bytes)
        self.hooks.engine_died(name)
        handle.engine.shutdown()  # reaps the process and closes its pipe

    def _models_at_once(self) -> int:
        with self._cond:
            return most_resident(self.budget_bytes, [e.footprint_bytes for e in self._entries.values() if e.listed])

    def _fail(self, entry: _Entry, error: Exception) -> None:
        waiters, entry.waiters = entry.waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future, None, error)


def _resolve(future: asyncio.Future, handle: ModelEngine | None, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(handle)
