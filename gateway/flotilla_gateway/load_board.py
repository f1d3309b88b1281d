"""What the gateway knows of each pod's load: its own in-flight count (instant) and the figures the pod
publishes at LOAD_PATH (polled every `poll_interval_s`), including, on a pool pod, each model's state. A pod
never read, or read too long ago, counts as saturated in routing (routing.STALE_AFTER_S)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

import aiohttp
from flotilla_contract.load import LOAD_PATH, ServerLoad
from pydantic import ValidationError

from flotilla_gateway.residency import Residence
from flotilla_gateway.routing import PodView

DEFAULT_POLL_INTERVAL_S = 0.25


class LoadBoard:
    def __init__(self, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        self.poll_interval_s = poll_interval_s
        self.in_flight: dict[str, int] = {}
        self.reports: dict[str, tuple[ServerLoad, float]] = {}  # address → (report, monotonic time read)
        self._task: asyncio.Task[None] | None = None

    def view(self, address: str, now: float | None = None) -> PodView:
        now = time.monotonic() if now is None else now
        in_flight = self.in_flight.get(address, 0)
        report = self.reports.get(address)
        if report is None:
            return PodView(address, in_flight=in_flight)
        load, read_at = report
        return PodView(address, in_flight=in_flight, waiting=load.waiting, running=load.running, slots=load.slots,
                       queue_capacity=load.queue_capacity, kv_usage=load.kv_usage, load_age_s=now - read_at,
                       accepting=load.ready)

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
        timeout = aiohttp.ClientTimeout(total=max(0.2, 2 * self.poll_interval_s))
        while True:
            addresses = pods()
            for gone in set(self.reports) - addresses:
                del self.reports[gone]
            await asyncio.gather(*(self._read(session, a, timeout) for a in addresses))
            on_update()
            await asyncio.sleep(self.poll_interval_s)

    async def _read(self, session: aiohttp.ClientSession, address: str, timeout: aiohttp.ClientTimeout) -> None:
        try:
            async with session.get(f"http://{address}{LOAD_PATH}", timeout=timeout) as response:
                if response.status != 200:
                    return  # a server without the endpoint stays stale: routing treats it as saturated
                self.reports[address] = (ServerLoad.model_validate_json(await response.read()), time.monotonic())
        except (aiohttp.ClientError, TimeoutError, ValidationError, OSError):
            return
