"""kopf wiring of reconciliation: start-up, create/update/resume, the drift timer, child events.

Thin: every handler takes the per-model lock and calls `reconciler.reconcile` or
`reconciler.write_status`. Transient API failures become `kopf.TemporaryError` with exponential
backoff; kopf retries them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
from flotilla_contract.labels import INSTANCE_LABEL, MANAGED_BY_LABEL

from flotilla_operator import credentials, metrics, reconciler, types
from flotilla_operator.events import object_ref, post_event
from flotilla_operator.kube import KubeClient, KubeError
from flotilla_operator.manifests import MANAGED_BY
from flotilla_operator.pool_reconciler import sync_pools
from flotilla_operator.settings import OperatorSettings

MAX_BACKOFF_S = 60.0
STORAGE_PREFIX = "flotilla.dev"
FINALIZER = "flotilla.dev/operator"
TIMER_EXIT_POLL_S = 1.0


def backoff_s(retry: int) -> float:
    """1, 2, 4, … seconds, capped: how long to wait before retry number `retry + 1`."""
    return min(MAX_BACKOFF_S, 2.0 ** retry)


async def guarded(ctx: reconciler.Context, namespace: str, name: str, retry: int, coro_fn: Any) -> None:
    async with ctx.lock(namespace, name):
        try:
            await coro_fn()
        except KubeError as error:
            metrics.RECONCILE_ERRORS.labels(resource="inferencemodel").inc()
            if error.transient:
                raise kopf.TemporaryError(f"{error}; retrying", delay=backoff_s(retry)) from error
            raise


async def _reconcile_and_sync(ctx: reconciler.Context, body: dict[str, Any],
                              logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Reconcile a model, then the pools it names now or named before (its membership may have changed)."""
    await reconciler.reconcile(ctx, body, logger)
    pools = {(body.get("spec") or {}).get("pool"), (body.get("status") or {}).get("pool")}
    await sync_pools(ctx, body["metadata"]["namespace"], pools, logger)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    resource = (types.GROUP, types.VERSION, types.PLURAL)

    @kopf.on.startup(id="start", registry=registry)
    async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        # Keep kopf's bookkeeping in annotations: status then holds only fields the CRD declares.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=STORAGE_PREFIX)
        settings.persistence.finalizer = FINALIZER  # stops the drift timer cleanly on deletion
        settings.posting.enabled = False  # one way to post Events: events.post_event (log lines stay logs)
        settings.watching.server_timeout = 300
        # A deleted object keeps its finalizer until its drift timer exits; a timer caught mid-run (waiting on the
        # model's lock) is re-checked after this many seconds, not kopf's default 60, so deletion stays prompt.
        settings.background.cancellation_polling = TIMER_EXIT_POLL_S
        kube = KubeClient(current=await asyncio.to_thread(credentials.login))  # an exec plugin may run: off the loop
        monitoring = await kube.has_api_group("monitoring.coreos.com/v1")
        memo.ctx = reconciler.Context(memo.settings, kube, monitoring)
        logger.info(f"ServiceMonitors {'enabled' if monitoring else 'disabled: monitoring.coreos.com/v1 not served'}")

    @kopf.on.cleanup(id="stop", registry=registry)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "ctx", None) is not None:
            await memo.ctx.kube.close()

    @kopf.on.resume(*resource, id="reconcile", registry=registry)
    @kopf.on.create(*resource, id="reconcile", registry=registry)
    @kopf.on.update(*resource, id="reconcile", registry=registry)
    async def reconcile_model(body: kopf.Body, name: str, namespace: str, retry: int, memo: kopf.Memo,
                              logger: logging.Logger, **_: Any) -> None:
        await guarded(memo.ctx, namespace, name, retry, lambda: _reconcile_and_sync(memo.ctx, dict(body), logger))

    @kopf.timer(*resource, id="drift", interval=settings.drift_interval_s,
                initial_delay=settings.drift_interval_s, registry=registry)
    async def correct_drift(body: kopf.Body, name: str, namespace: str, retry: int, memo: kopf.Memo,
                            logger: logging.Logger, **_: Any) -> None:
        await guarded(memo.ctx, namespace, name, retry, lambda: reconciler.reconcile(memo.ctx, dict(body), logger))

    @kopf.on.delete(*resource, id="forget", optional=True, registry=registry)
    async def forget_model(spec: kopf.Spec, status: kopf.Status, name: str, namespace: str, memo: kopf.Memo,
                           logger: logging.Logger, **_: Any) -> None:
        served_name = (spec.get("model") or {}).get("name") or name
        reconciler.forget(namespace, served_name)  # children go with their owner references
        pools = {spec.get("pool"), status.get("pool")} - {None}
        if pools and getattr(memo, "ctx", None) is not None:  # a pool drops the member from its ConfigMap now
            await guarded(memo.ctx, namespace, name, 0, lambda: sync_pools(memo.ctx, namespace, pools, logger))

    @kopf.on.event("", "v1", "pods", labels={MANAGED_BY_LABEL: MANAGED_BY}, id="pod-status", registry=registry)
    async def pod_changed(body: kopf.Body, namespace: str, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        """A pod's state changed: recompute status, so pod failures show (pod_health.py) without a drift tick."""
        owner = (body.get("metadata", {}).get("labels") or {}).get(INSTANCE_LABEL)
        ctx: reconciler.Context | None = getattr(memo, "ctx", None)
        if not owner or ctx is None:
            return
        try:
            async with ctx.lock(namespace, owner):
                await reconciler.write_status(ctx, namespace, owner, problems=None)
        except KubeError as error:  # events are not retried by kopf; the drift timer catches up
            logger.warning(f"could not refresh {namespace}/{owner} after a pod event: {error}")

    @kopf.on.event("apps", "v1", "deployments", labels={MANAGED_BY_LABEL: MANAGED_BY},
                   id="deployment-status", registry=registry)
    async def deployment_changed(event: kopf.RawEvent, body: kopf.Body, namespace: str, memo: kopf.Memo,
                                 logger: logging.Logger, **_: Any) -> None:
        owner = (body.get("metadata", {}).get("labels") or {}).get(INSTANCE_LABEL)
        ctx: reconciler.Context | None = getattr(memo, "ctx", None)
        if not owner or ctx is None:
            return
        try:
            async with ctx.lock(namespace, owner):
                model = await ctx.kube.get(types.API_VERSION, types.PLURAL, namespace, owner)
                if model is None or model["metadata"].get("deletionTimestamp"):
                    return
                if event["type"] == "DELETED":  # recreate now rather than at the next drift tick
                    logger.info(f"Deployment {namespace}/{owner} was deleted; recreating it")
                    await post_event(ctx.kube, object_ref(namespace, owner, model["metadata"]["uid"]), "Warning",
                                     "Recreating", "the Deployment was deleted by someone else")
                    await reconciler.reconcile(ctx, model, logger)
                else:
                    await reconciler.write_status(ctx, namespace, owner, problems=None)
        except KubeError as error:  # events are not retried by kopf; the drift timer catches up
            logger.warning(f"could not refresh {namespace}/{owner} after a Deployment event: {error}")
