"""Keeps the route map current: lists, then watches, InferenceModels, ModelPools and EndpointSlices.

The gateway reports ready only after the first full listing of each, so a restarted gateway never
answers 404 for a model that exists (docs/gateway.md, "Route map"). A watch that ends is resumed from
its last resourceVersion; one that expired (410 Gone) or failed lists again, after a short back-off.
A cluster without the ModelPool CRD (a chart upgrade does not add CRDs) answers 404: that counts as a
listing with no pools, and the gateway looks again every ABSENT_KIND_RETRY_S.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from flotilla_contract.labels import SERVICE_NAME_LABEL

from flotilla_gateway.kube import (
    ENDPOINT_SLICES_RESOURCE,
    MODELS_RESOURCE,
    POOLS_RESOURCE,
    KubeClient,
    KubeError,
    Resource,
)
from flotilla_gateway.route_map import ModelRoute, build_routes

log = logging.getLogger("flotilla_gateway.watcher")
RETRY_S = 1.0
ABSENT_KIND_RETRY_S = 30.0


class RouteWatcher:
    def __init__(self, kube: KubeClient, namespaces: list[str] | None, on_change: Callable[[], None]) -> None:
        self.kube = kube
        self.namespaces: list[str | None] = list(namespaces) if namespaces else [None]  # None: all namespaces
        self.on_change = on_change
        self.routes: dict[str, ModelRoute] = {}
        self.models: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[tuple[str, str], dict[str, Any]] = {}
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.listed = asyncio.Event()  # set once every resource in every namespace was listed
        self._pending_lists = 3 * len(self.namespaces)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for namespace in self.namespaces:
            self._tasks.append(asyncio.create_task(self._run(MODELS_RESOURCE, namespace, self.models, None)))
            self._tasks.append(asyncio.create_task(self._run(POOLS_RESOURCE, namespace, self.pools, None)))
            self._tasks.append(asyncio.create_task(
                self._run(ENDPOINT_SLICES_RESOURCE, namespace, self.slices, SERVICE_NAME_LABEL)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _rebuild(self) -> None:
        self.routes = build_routes(self.models.values(), self.slices.values(), self.pools.values())
        self.on_change()

    def _listed_once(self) -> None:
        self._pending_lists -= 1
        if self._pending_lists == 0:
            self.listed.set()

    async def _run(self, resource: Resource, namespace: str | None, store: dict[tuple[str, str], dict[str, Any]],
                   labels: str | None) -> None:
        first = True
        while True:
            try:
                try:
                    listing = await self.kube.list(resource, namespace, labels)
                except KubeError as error:
                    if error.status != 404 or resource is not POOLS_RESOURCE:
                        raise
                    if first:  # no ModelPool CRD: no pools, and the route map is complete without them
                        first = False
                        log.warning("no ModelPool kind in this cluster (%s): pooled models cannot be routed; looking "
                                    "again every %.0f s", error, ABSENT_KIND_RETRY_S)
                        self._listed_once()
                    await asyncio.sleep(ABSENT_KIND_RETRY_S)
                    continue
                fresh = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                         for o in listing.get("items", [])}
                for key in [k for k in store if namespace is None or k[0] == namespace]:
                    store.pop(key)
                store.update(fresh)
                if first:
                    first = False
                    self._listed_once()
                self._rebuild()
                version = listing.get("metadata", {}).get("resourceVersion", "0")
                while True:  # resume each ended watch from the last version seen
                    async for event in self.kube.watch(resource, namespace, version, labels):
                        obj = event.get("object", {})
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if event["type"] == "BOOKMARK":
                            continue
                        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                        if event["type"] == "DELETED":
                            store.pop(key, None)
                        else:
                            store[key] = obj
                        self._rebuild()
            except asyncio.CancelledError:
                raise
            except KubeError as error:
                if error.status != 410:
                    log.warning("watching %s in %s: %s; listing again in %.0f s", resource.plural,
                                namespace or "all namespaces", error, RETRY_S)
                    await asyncio.sleep(RETRY_S)
            except Exception as error:  # a dropped connection, an unreachable API server
                log.warning("watching %s in %s failed (%r); listing again in %.0f s", resource.plural,
                            namespace or "all namespaces", error, RETRY_S)
                await asyncio.sleep(RETRY_S)
