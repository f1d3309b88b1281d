"""Wakes a model from zero: one conditional 0 → 1 write of its scale subresource, then the woken-at stamp.

The write is a JSON patch that first tests `/spec/replicas == 0`, so a second gateway replica waking at the
same moment, or an autoscaler that already wrote 3, can never be overwritten with 1: the API server refuses
the stale patch and the larger count stands. The wake runs in its own task, so a client that leaves does
not cancel it; it is deduplicated per InferenceModel generation (each scale write bumps the generation).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from flotilla_contract.labels import WOKEN_AT_ANNOTATION

from flotilla_gateway.kube import MODELS_RESOURCE, KubeClient, KubeError
from flotilla_gateway.metrics import GatewayMetrics
from flotilla_gateway.route_map import ModelRoute

log = logging.getLogger("flotilla_gateway.waker")
ATTEMPTS = 3
BACKOFF_S = 0.5
SCALE_UP_PATCH = [{"op": "test", "path": "/spec/replicas", "value": 0},
                  {"op": "replace", "path": "/spec/replicas", "value": 1}]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Waker:
    def __init__(self, kube: KubeClient | None, metrics: GatewayMetrics) -> None:
        self.kube = kube
        self.metrics = metrics
        self._woken: dict[tuple[str, str], int] = {}  # InferenceModel → generation already woken
        self._tasks: set[asyncio.Task[None]] = set()

    def wake(self, route: ModelRoute) -> None:
        """Start the wake of `route`'s model unless one already ran for this generation."""
        key = (route.namespace, route.resource)
        if self.kube is None or self._woken.get(key) == route.generation:
            return
        self._woken[key] = route.generation
        task = asyncio.create_task(self._wake(route))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wake(self, route: ModelRoute) -> None:
        assert self.kube is not None
        for attempt in range(ATTEMPTS):
            try:
                await self.kube.patch(MODELS_RESOURCE, route.namespace, route.resource, SCALE_UP_PATCH,
                                      json_patch=True, subresource="scale")
            except KubeError as error:
                if error.status in (409, 422):  # the test failed: someone already scaled it up
                    self.metrics.wake(route, "lost_race")
                    log.info("wake of %s/%s: already scaled up elsewhere", route.namespace, route.resource)
                    return
                log.warning("wake of %s/%s failed (attempt %d): %s", route.namespace, route.resource,
                            attempt + 1, error)
                await asyncio.sleep(BACKOFF_S * 2**attempt)
                continue
            except Exception as error:
                log.warning("wake of %s/%s failed (attempt %d): %r", route.namespace, route.resource,
                            attempt + 1, error)
                await asyncio.sleep(BACKOFF_S * 2**attempt)
                continue
            self.metrics.wake(route, "woken")
            log.info("woke %s/%s: replicas 0 → 1", route.namespace, route.resource)
            try:
                await self.kube.patch(MODELS_RESOURCE, route.namespace, route.resource,
                                      {"metadata": {"annotations": {WOKEN_AT_ANNOTATION: now_rfc3339()}}})
            except Exception as error:
                log.warning("stamping %s on %s/%s failed: %r", WOKEN_AT_ANNOTATION, route.namespace,
                            route.resource, error)
            return
        self.metrics.wake(route, "failed")
        self._woken.pop((route.namespace, route.resource), None)  # a later hold may try again

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
