"""Wakes a model from zero: one conditional 0 → 1 write of a scale subresource, then the woken-at stamp.

What is woken is what scales the model (ModelRoute.scaled_by): its InferenceModel, or, for a pooled model,
its ModelPool, so the members of one pool share one wake. The write is a JSON patch that first tests
`/spec/replicas == 0`, so a second gateway replica waking at the same moment, or an autoscaler that already
wrote 3, can never be overwritten with 1: the API server refuses the stale patch and the larger count
stands. The wake runs in its own task, so a client that leaves does not cancel it; it is deduplicated per
generation of the object woken (each scale write bumps the generation).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from flotilla_contract.labels import WOKEN_AT_ANNOTATION

from flotilla_gateway.kube import MODELS_RESOURCE, POOLS_RESOURCE, KubeClient, KubeError, Resource
from flotilla_gateway.metrics import GatewayMetrics
from flotilla_gateway.route_map import ModelRoute

log = logging.getLogger("flotilla_gateway.waker")
ATTEMPTS = 3
BACKOFF_S = 0.5
SCALE_UP_PATCH = [{"op": "test", "path": "/spec/replicas", "value": 0},
                  {"op": "replace", "path": "/spec/replicas", "value": 1}]
RESOURCES: dict[str, Resource] = {"InferenceModel": MODELS_RESOURCE, "ModelPool": POOLS_RESOURCE}


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Waker:
    def __init__(self, kube: KubeClient | None, metrics: GatewayMetrics) -> None:
        self.kube = kube
        self.metrics = metrics
        self._woken: dict[tuple[str, str, str], int] = {}  # (kind, namespace, name) → generation already woken
        self._tasks: set[asyncio.Task[None]] = set()

    def wake(self, route: ModelRoute) -> None:
        """Start the wake of what scales `route`'s model unless one already ran for this generation."""
        kind, name = route.scaled_by
        key = (kind, route.namespace, name)
        if self.kube is None or self._woken.get(key) == route.generation:
            return
        self._woken[key] = route.generation
        task = asyncio.create_task(self._wake(route, key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wake(self, route: ModelRoute, key: tuple[str, str, str]) -> None:
        assert self.kube is not None
        kind, namespace, name = key
        resource, what = RESOURCES[kind], f"{kind} {namespace}/{name} (for model {route.name!r})"
        for attempt in range(ATTEMPTS):
            try:
                await self.kube.patch(resource, namespace, name, SCALE_UP_PATCH, json_patch=True, subresource="scale")
            except KubeError as error:
                if error.status in (409, 422):  # the test failed: someone already scaled it up
                    self.metrics.wake(route, "lost_race")
                    log.info("wake of %s: already scaled up elsewhere", what)
                    return
                log.warning("wake of %s failed (attempt %d): %s", what, attempt + 1, error)
                await asyncio.sleep(BACKOFF_S * 2**attempt)
                continue
            except Exception as error:
                log.warning("wake of %s failed (attempt %d): %r", what, attempt + 1, error)
                await asyncio.sleep(BACKOFF_S * 2**attempt)
                continue
            self.metrics.wake(route, "woken")
            log.info("woke %s: replicas 0 → 1", what)
            try:
                await self.kube.patch(resource, namespace, name,
                                      {"metadata": {"annotations": {WOKEN_AT_ANNOTATION: now_rfc3339()}}})
            except Exception as error:
                log.warning("stamping %s on %s failed: %r", WOKEN_AT_ANNOTATION, what, error)
            return
        self.metrics.wake(route, "failed")
        self._woken.pop(key, None)  # a later hold may try again

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
