"""Which pool pods hold which member loaded, from the servers' own load reports (docs/pools.md, "Residency").

`residency()` is pure: pod name → the `ServerLoad` it answered at LOAD_PATH (None: no answer) in, the
pods holding each model and the pool's count of (pod, model) pairs out. `read_loads` is the thin shell:
one short GET per running pool pod, concurrently; a pod that does not answer holds nothing as far as
status is concerned (the next pass asks again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pydantic
from flotilla_contract.load import LOAD_PATH, ServerLoad

from flotilla_operator.adapter_status import PodAdapters, pods_adapters
from flotilla_operator.server_args import PORT

LOAD_TIMEOUT_S = 2.0  # the report is light (docs/architecture.md, "Load report"); a slow pod is skipped


@dataclass(frozen=True)
class Residency:
    pods_by_model: dict[str, tuple[str, ...]] = field(default_factory=dict)  # only `loaded` counts as holding
    adapters_by_pod: dict[str, PodAdapters | None] = field(default_factory=dict)  # each pod's adapters (None: no report)

    @property
    def resident_count(self) -> int:
        return sum(len(pods) for pods in self.pods_by_model.values())

    def pods_holding(self, model: str) -> list[str]:
        return list(self.pods_by_model.get(model, ()))


def residency(reports: Mapping[str, ServerLoad | None]) -> Residency:
    """The pods (sorted) holding each model loaded; pods without a report hold nothing."""
    holding: dict[str, list[str]] = {}
    for pod, report in sorted(reports.items()):
        for model in (report.models if report is not None else ()):
            if model.state == "loaded":
                holding.setdefault(model.name, []).append(pod)
    return Residency({model: tuple(pods) for model, pods in sorted(holding.items())}, pods_adapters(reports))


def load_url(pod: dict[str, Any]) -> str | None:
    """Where a running pod answers LOAD_PATH: its IP and the container's `http` port; None if not running."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return None
    port = PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for declared in container.get("ports") or []:
            if declared.get("name") == "http":
                port = declared["containerPort"]
    return f"http://{status['podIP']}:{port}{LOAD_PATH}"


async def _read_one(client: httpx.AsyncClient, url: str | None) -> ServerLoad | None:
    if url is None:
        return None
    try:
        response = await client.get(url)
        response.raise_for_status()
        return ServerLoad.model_validate(response.json())
    except (httpx.HTTPError, ValueError, pydantic.ValidationError):
        return None


async def read_loads(pods: list[dict[str, Any]], timeout_s: float = LOAD_TIMEOUT_S) -> dict[str, ServerLoad | None]:
    """Each pod's load report, asked concurrently."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        reports = await asyncio.gather(*(_read_one(client, load_url(pod)) for pod in pods))
    return {pod["metadata"]["name"]: report for pod, report in zip(pods, reports, strict=True)}
