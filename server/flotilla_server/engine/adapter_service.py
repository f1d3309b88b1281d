"""Adapters loaded and unloaded while the engine serves (mechanism): the runtime API's calls (LoadAdapter,
UnloadAdapter) and the `--lora-list-file` as it changes, carried out between steps by the engine loop.

Why here, in the engine process: the engine holds the base model's config, which every adapter is checked
against (model/lora_adapter.py), and the adapter cache, which only the engine loop writes. Reading a PEFT
directory may take a while (disk, a network volume), so it runs on a thread of its own and the engine keeps
stepping; the adapter joins the cache, and the call is answered, on the first turn after the read ends.

Rules: engine/adapter_requests.py decides (idempotent loads, joined reads, 404 and 409); lora_list.py plans
the list's changes. Beside them:
- the list file is checked every LIST_POLL_S; an adapter it lists that failed to load is tried again every
  RETRY_S, and a line whose adapter fails is logged once per failure (no caller waits for it);
- an adapter the list file loaded is the file's: the API's unload refuses it (409: remove its line), and a
  load of its name from another directory is a 409;
- an unloaded adapter's last requests finish (engine/adapter_cache.py's `release`, run by the loop).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from flotilla_server.engine.adapter_cache import AdapterCache
from flotilla_server.engine.adapter_requests import LoadStep, decide_load, decide_unload
from flotilla_server.engine.lora_list import LIST_POLL_S, RETRY_S, LoraListFile, plan_changes
from flotilla_server.engine.messages import AdapterReply, LoadAdapter, UnloadAdapter
from flotilla_server.model.config import ModelConfig
from flotilla_server.model.lora_adapter import LoraAdapter, LoraAdapterError, load_adapter

log = logging.getLogger("flotilla.engine")

READ_POLL_S = 0.005  # an idle engine's check on adapters being read
Reader = Callable[[str, str, ModelConfig, int], LoraAdapter]  # load_adapter's signature


@dataclass
class _Read:
    source: str
    future: Future
    call_ids: list[str] = field(default_factory=list)  # the API calls waiting for it
    listed: bool = False  # the list file asked for it: it owns the adapter once read
    started_s: float = 0.0


class AdapterService:
    def __init__(self, cache: AdapterCache | None, base: ModelConfig, max_rank: int, *, runtime_loads: bool,
                 reserved: Collection[str] = (), flag_names: Collection[str] = (),
                 list_file: LoraListFile | None = None,
                 listed: dict[str, str] | None = None, reader: Reader = load_adapter,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache, self.base, self.max_rank = cache, base, max_rank
        self.runtime_loads = runtime_loads
        self.reserved = frozenset(reserved)  # the names the base model answers to
        self.flag_names = frozenset(flag_names)  # --lora adapters: the list file may not take their names
        self.list_file = list_file
        self.listed: dict[str, str] = dict(listed or {})  # what the file's last good version lists
        self.owned: dict[str, str] = dict(listed or {})  # adapters the list loaded and still serves: name -> source
        self._reader, self._clock = reader, clock
        self._reads: dict[str, _Read] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._replies: list[AdapterReply] = []
        self._next_check_s = clock() + LIST_POLL_S
        self._retry_s = float("inf")  # when listed adapters not served are tried again
        self._failures: dict[str, str] = {}  # name -> the last failure logged for a listed adapter
        self._line_refusals: tuple[tuple[str, str], ...] = ()  # the file's last version's refused lines: (name, why)
        self.changed = False  # the adapters served changed since the loop last sent its stats (it resets this)

    # --- calls (between steps) ------------------------------------------------------------------

    def load(self, call: LoadAdapter) -> None:
        refusal = self._refusal(call.call_id) or (None if self.runtime_loads else AdapterReply(
            call.call_id, 403, "Runtime adapter loads are off: start the server with --lora-dir.", "lora_path"))
        if refusal is not None:
            self._replies.append(refusal)
            return
        self._load(call.name, call.source, call.call_id)

    def unload(self, call: UnloadAdapter) -> None:
        refusal = self._refusal(call.call_id)
        if refusal is None and call.name in self.owned and self.list_file is not None:
            refusal = AdapterReply(call.call_id, 409, f"The LoRA adapter {call.name!r} is listed in --lora-list-file "
                                   f"{self.list_file.path}: remove its line there to unload it.", "lora_name")
        self._replies.append(refusal or self._unload(call.name, call.call_id))

    def _refusal(self, call_id: str) -> AdapterReply | None:
        if self.cache is not None:
            return None
        return AdapterReply(call_id, 403, "This server serves no LoRA adapters: start it with --lora-dir (or "
                            "--lora, --lora-list-file).", "lora_name")

    def _load(self, name: str, source: str, call_id: str | None) -> None:
        assert self.cache is not None
        source_now = self.cache.source_of(name)
        served = {} if source_now is None else {name: os.path.realpath(source_now)}
        read_now = self._reads.get(name)
        reading = {} if read_now is None else {name: os.path.realpath(read_now.source)}
        decision = decide_load(name, os.path.realpath(source), served, reading, self.reserved)
        if decision.step is LoadStep.START:
            self._pool = self._pool or ThreadPoolExecutor(1, thread_name_prefix="flotilla-lora-read")
            future = self._pool.submit(self._reader, name, source, self.base, self.max_rank)
            self._reads[name] = _Read(source, future, started_s=self._clock())
        if decision.step is LoadStep.ANSWER:
            if call_id is not None:
                self._replies.append(AdapterReply(call_id, decision.status, decision.message, decision.param))
            elif decision.status == 200:
                self.owned[name] = source  # the list now owns an adapter the API loaded from its source
            else:
                self._failed(name, decision.message)
            return
        read = self._reads[name]
        if call_id is None:
            read.listed = True
        else:
            read.call_ids.append(call_id)

    def _unload(self, name: str, call_id: str | None) -> AdapterReply:
        assert self.cache is not None
        decision = decide_unload(name, self.cache.served, self._reads)
        if decision.status == 200:
            self.cache.retire(name)
            self.changed = True
            self.owned.pop(name, None)
            log.info("LoRA adapter %s unloaded; requests already admitted finish with it", name)
        return AdapterReply(call_id or "", decision.status, decision.message, decision.param)

    # --- each turn --------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Reads are running: the loop polls for them instead of waiting for a message."""
        return bool(self._reads)

    def idle_wait_s(self) -> float | None:
        """How long an idle loop may wait for a message before `turn` is due."""
        if self._reads:
            return READ_POLL_S
        if self.list_file is None:
            return None
        return max(0.0, self._next_check_s - self._clock())

    def refused(self) -> tuple[tuple[str, str], ...]:
        """Adapters the list file asks for and that are not served, with why (the load report's
        adapters_refused): its last version's refused lines, then listed adapters whose load failed (tried
        again every RETRY_S). A runtime API load that fails is answered to its caller, not kept here."""
        failed = tuple((n, why) for n, why in self._failures.items() if n in self.listed and n not in self.owned)
        return self._line_refusals + failed

    def turn(self) -> list[AdapterReply]:
        """Adapters whose read ended join the cache (or are refused); the list file is followed. Returns the
        answers due to API calls."""
        refused_before = self.refused()
        for name, read in list(self._reads.items()):
            if read.future.done():
                del self._reads[name]
                self._finish(name, read)
        now = self._clock()
        if self.list_file is not None and now >= self._next_check_s:
            self._next_check_s = now + LIST_POLL_S
            self._follow_list(now)
        if self.refused() != refused_before:
            self.changed = True  # the loop sends its stats: the load report shows the refusal
        replies, self._replies = self._replies, []
        return replies

    def _finish(self, name: str, read: _Read) -> None:
        assert self.cache is not None
        error = read.future.exception()
        if error is None:
            self.cache.add(read.future.result())
            self.changed = True
            if read.listed:
                self.owned[name] = read.source
                self._failures.pop(name, None)
            log.info("LoRA adapter %s loaded from %s in %.2f s", name, read.source, self._clock() - read.started_s)
            status, message = 200, f"Success: LoRA adapter '{name}' added successfully."
        else:
            status = 400
            message = str(error) if isinstance(error, LoraAdapterError) else \
                f"LoRA adapter {name!r}: {read.source} could not be read ({type(error).__name__}: {error})"
            if read.listed:
                self._failed(name, message)
        for call_id in read.call_ids:
            self._replies.append(AdapterReply(call_id, status, message, None if status == 200 else "lora_path"))

    def _failed(self, name: str, message: str) -> None:
        if self._failures.get(name) != message:
            log.error("--lora-list-file's adapter %s is not served: %s", name, message)
        self._failures[name] = message
        self._retry_s = min(self._retry_s, self._clock() + RETRY_S)

    def _follow_list(self, now: float) -> None:
        assert self.list_file is not None
        try:
            listed = self.list_file.read_if_changed()
        except (OSError, UnicodeDecodeError) as e:
            log.error("--lora-list-file %s cannot be read (%s): the adapters listed before stay", self.list_file.path, e)
            return
        if listed is None and now < self._retry_s:
            return
        if listed is not None:
            for problem in listed.problems:
                log.error("%s: the line is skipped", problem)
            refusals = list(zip(listed.problem_names, listed.problems, strict=True))
            for name in self.flag_names & listed.entries.keys():
                why = f"--lora-list-file {self.list_file.path} lists the adapter {name!r}, which --lora serves"
                log.error("%s: the line is skipped", why)
                refusals.append((name, f"{why}: remove its line"))
            self._line_refusals = tuple(refusals)
            self.listed = {name: source for name, source in listed.entries.items() if name not in self.flag_names}
        if self.cache is None:
            return
        changes = plan_changes(self.owned, self.listed)
        for name in changes.unloads:
            self._unload(name, None)
        for name, source in changes.loads:
            if name not in self._reads or not self._reads[name].listed:
                self._load(name, source, None)
        self._retry_s = float("inf")
        unserved = [name for name in self.listed if name not in self.owned and name not in self._reads]
        if unserved:
            self._retry_s = now + RETRY_S

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
