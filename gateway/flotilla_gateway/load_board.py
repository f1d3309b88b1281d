"""What the gateway knows of each pod's load: its own in-flight count (instant) and the figures the pod
publishes at LOAD_PATH (polled every `poll_interval_s`), including, on a pool pod, each model's state. A pod
never read, or read too long ago, counts as saturated in routing (routing.STALE_AFTER_S).

Which pods hold a prefix comes from the same reports (their `prefix_keys`), and, for SENT_GRACE_S after
this gateway sends a key somewhere, from that send: a prompt's blocks reach the cache only once its prefill
is done, and the requests that follow it meanwhile should follow it there. The keys sent to each pod within
SENT_GRACE_S are its active prefixes, which cold keys are spread by.

Adapters likewise (adapter_routing.py): a pod holds an adapter when its report lists it resident, or for
SENT_GRACE_S after this gateway sent it a request for it (the copy into a slot happens at admission); its
free adapter slots are its report's (for a pool pod, those of the adapter's base, when loaded there); an
adapter's load is this gateway's count of its requests in flight."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import aiohttp
from flotilla_contract.load import LOAD_PATH, ServerLoad
from pydantic import ValidationError

from flotilla_gateway.residency import Residence
from flotilla_gateway.routing import STALE_AFTER_S, PodView

DEFAULT_POLL_INTERVAL_S = 0.25
SENT_GRACE_S = 10.0  # a queued 1,024-token prefill on a busy CPU server takes seconds


class LoadBoard:
    def __init__(self, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        self.poll_interval_s = poll_interval_s
        self.in_flight: dict[str, int] = {}
        self.reports: dict[str, tuple[ServerLoad, float]] = {}  # address → (report, monotonic time read)
        self.cached_keys: dict[str, frozenset[str]] = {}  # address → its report's prefix_keys
        self._sent: dict[str, tuple[str, float]] = {}  # prefix key → (address last sent to, monotonic time)
        self._recent: dict[str, set[str]] = {}  # address → the keys last sent there, within the grace
        self.adapter_in_flight: dict[str, int] = {}  # adapter → requests this gateway sent and not finished
        self._adapter_sent: dict[tuple[str, str], float] = {}  # (adapter, address) → monotonic time last sent
        self._task: asyncio.Task[None] | None = None

    def note_sent(self, key: str, address: str) -> None:
        before = self._sent.get(key)
        if before is not None and before[0] != address:
            self._recent.get(before[0], set()).discard(key)
        self._sent[key] = (address, time.monotonic())
        self._recent.setdefault(address, set()).add(key)

    def holders(self, key: str) -> frozenset[str]:
        """The pods holding the prefix `key`: by their reports, or sent it within SENT_GRACE_S."""
        found = {a for a, keys in self.cached_keys.items() if key in keys}
        sent = self._sent.get(key)
        if sent is not None and time.monotonic() - sent[1] <= SENT_GRACE_S:
            found.add(sent[0])
        return frozenset(found)

    # -- adapters ------------------------------------------------------------------------------------

    def adapter_sent(self, adapter: str, address: str) -> None:
        self._adapter_sent[(adapter, address)] = time.monotonic()
        self.adapter_in_flight[adapter] = self.adapter_in_flight.get(adapter, 0) + 1

    def adapter_done(self, adapter: str) -> None:
        left = self.adapter_in_flight.get(adapter, 1) - 1
        if left > 0:
            self.adapter_in_flight[adapter] = left
        else:
            self.adapter_in_flight.pop(adapter, None)

    def adapter_holders(self, adapter: str) -> frozenset[str]:
        """The pods holding `adapter` in a slot: by their reports, or sent it within SENT_GRACE_S."""
        now = time.monotonic()
        found = {a for a, (report, _) in self.reports.items() if adapter in report.adapters_resident}
        found |= {a for (name, a), at in self._adapter_sent.items() if name == adapter and now - at <= SENT_GRACE_S}
        return frozenset(found)

    def adapter_servers(self, addresses: Iterable[str], adapter: str) -> list[str]:
        """Of `addresses`, those whose report lists `adapter` as served."""
        return [a for a in addresses if (r := self.reports.get(a)) is not None
                and any(s.name == adapter for s in r[0].adapters)]

    def adapter_free_slots(self, addresses: Iterable[str], base: str) -> dict[str, int]:
        """Each pod's free adapter slots for an adapter of `base` (a pool pod: its row for `base`)."""
        free: dict[str, int] = {}
        for address in addresses:
            report = self.reports.get(address)
            if report is None:
                continue
            row = next((m for m in report[0].models if m.name == base), None)
            free[address] = row.adapter_slots_free if row is not None and row.max_loras else \
                report[0].adapter_slots_free if len(report[0].models) <= 1 else 0
        return free

    def reported_adapters(self) -> dict[str, list[tuple[str, str]]]:
        """Address → (adapter, base) of every adapter its report serves (adapter_index.adapter_bases' input)."""
        return {a: [(s.name, s.base) for s in report.adapters] for a, (report, _) in self.reports.items()}

    def _forget_old_sends(self) -> None:
        now = time.monotonic()
        self._adapter_sent = {k: at for k, at in self._adapter_sent.items() if now - at <= SENT_GRACE_S}
        self._sent = {k: sent for k, sent in self._sent.items() if now - sent[1] <= SENT_GRACE_S}
        self._recent = {a: {k for k in keys if k in self._sent} for a, keys in self._recent.items()}

    def view(self, address: str, now: float | None = None) -> PodView:
        now = time.monotonic() if now is None else now
        in_flight = self.in_flight.get(address, 0)
        report = self.reports.get(address)
        if report is None:
            return PodView(address, in_flight=in_flight)
        load, read_at = report
        return PodView(address, in_flight=in_flight, waiting=load.waiting, running=load.running, slots=load.slots,
                       queue_capacity=load.queue_capacity, kv_usage=load.kv_usage, load_age_s=now - read_at,
                       accepting=load.ready,
                       recent_prefixes=len(self._recent.get(address, ())))

    def views(self, addresses: Iterable[str]) -> list[PodView]:
        now = time.monotonic()
        return [self.view(a, now) for a in addresses]

    def residences(self, addresses: Iterable[str], model: str) -> list[Residence]:
        """Each pool pod as it stands for `model`: its state there, waiting, memory, and its LRU idle model's age.
        A pod that does not report the model's size gets the size another pod reports (one model, one size)."""
        now = time.monotonic()
        addresses = list(addresses)
        sizes = [m.memory_bytes for a in addresses if (r := self.reports.get(a)) is not None for m in r[0].models
                 if m.name == model and m.memory_bytes is not None]
        found = []
        for address in addresses:
            view = self.view(address, now)
            report = self.reports.get(address)
            rows = report[0].models if report is not None else []
            row = next((m for m in rows if m.name == model), None)
            idle = [m.last_used_s for m in rows if m.state == "loaded" and m.waiting == 0 and m.running == 0
                    and m.last_used_s is not None]
            found.append(Residence(
                view, state=row.state if row is not None else None, model_waiting=row.waiting if row else 0,
                model_bytes=row.memory_bytes if row and row.memory_bytes is not None else max(sizes, default=None),
                free_bytes=report[0].memory_free_bytes if report is not None else None,
                lru_idle_s=max(idle, default=None)))
        return found

    def start(self, session: aiohttp.ClientSession, pods: Callable[[], set[str]], on_update: Callable[[], None]) -> None:
        self._task = asyncio.create_task(self._poll(session, pods, on_update))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self, session: aiohttp.ClientSession, pods: Callable[[], set[str]],
                    on_update: Callable[[], None]) -> None:
        # a read is worth its wait up to half the staleness bound: a report that slow is still fresh, and a busy
        # server's answer (2 cores under load: past 0.2 s) must not be dropped round after round until it is stale
        timeout = aiohttp.ClientTimeout(total=max(STALE_AFTER_S / 2, 2 * self.poll_interval_s))
        while True:
            addresses = pods()
            for gone in set(self.reports) - addresses:
                del self.reports[gone]
                self.cached_keys.pop(gone, None)
            await asyncio.gather(*(self._read(session, a, timeout) for a in addresses))
            self._forget_old_sends()
            on_update()
            await asyncio.sleep(self.poll_interval_s)

    async def _read(self, session: aiohttp.ClientSession, address: str, timeout: aiohttp.ClientTimeout) -> None:
        try:
            async with session.get(f"http://{address}{LOAD_PATH}", timeout=timeout) as response:
                if response.status != 200:
                    return  # a server without the endpoint stays stale: routing treats it as saturated
                report = ServerLoad.model_validate_json(await response.read())
                self.reports[address] = (report, time.monotonic())
                self.cached_keys[address] = frozenset(report.prefix_keys)
        except (aiohttp.ClientError, TimeoutError, ValidationError, OSError):
            return
