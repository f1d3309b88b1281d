"""kopf wiring of ModelPools: create/update/resume, the drift timer, and the pool Deployment's events.

Thin, like handlers/reconcile.py: each handler takes the pool's lock and calls
`pool_reconciler.reconcile_pool`. A change of the pool's Deployment (pods ready or lost) also refreshes
its members' status, which reports the pool's pods (docs/pools.md).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from flotilla_contract.labels import MODEL_POOL_LABEL

from flotilla_operator import pool_types, reconciler, types
from flotilla_operator.handlers.reconcile import guarded
from flotilla_operator.kube import KubeError
from flotilla_operator.pool_members import Member
from flotilla_operator.pool_reconciler import pool_lock_key, reconcile_pool
from flotilla_operator.pool_residency import Residency
from flotilla_operator.settings import OperatorSettings


async def reconcile_and_refresh_members(ctx: reconciler.Context, namespace: str, name: str, retry: int,
                                        logger: logging.Logger | logging.LoggerAdapter) -> None:
    """Reconcile the pool under its lock, then rewrite each member's status under the member's lock."""
    outcome: list[tuple[list[Member], Residency]] = []

    async def run() -> None:
        obj = await ctx.kube.get(types.API_VERSION, pool_types.PLURAL, namespace, name)
        if obj is not None and not obj["metadata"].get("deletionTimestamp"):
            outcome.append(await reconcile_pool(ctx, obj, logger))

    await guarded(ctx, namespace, pool_lock_key(name), retry, run)
    for found, resident in outcome:
        for member in found:
            async with ctx.lock(namespace, member.name):
                await reconciler.write_status(ctx, namespace, member.name, problems=None,
                                              resident_pods=resident.pods_holding(member.model),
                                              adapter_pods=resident.adapters_by_pod)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    resource = (types.GROUP, types.VERSION, pool_types.PLURAL)

    @kopf.on.resume(*resource, id="reconcile-pool", registry=registry)
    @kopf.on.create(*resource, id="reconcile-pool", registry=registry)
    @kopf.on.update(*resource, id="reconcile-pool", registry=registry)
    @kopf.timer(*resource, id="drift-pool", interval=settings.drift_interval_s,
                initial_delay=settings.drift_interval_s, registry=registry)
    async def reconcile(name: str, namespace: str, retry: int, memo: kopf.Memo, logger: logging.Logger,
                        **_: Any) -> None:
        await reconcile_and_refresh_members(memo.ctx, namespace, name, retry, logger)

    @kopf.on.event("apps", "v1", "deployments", labels={MODEL_POOL_LABEL: kopf.PRESENT},
                   id="pool-deployment-status", registry=registry)
    async def deployment_changed(body: kopf.Body, namespace: str, memo: kopf.Memo, logger: logging.Logger,
                                 **_: Any) -> None:
        pool = (body.get("metadata", {}).get("labels") or {}).get(MODEL_POOL_LABEL)
        ctx: reconciler.Context | None = getattr(memo, "ctx", None)
        if not pool or ctx is None:
            return
        try:  # a deleted Deployment is recreated here too: reconcile plans it again
            await reconcile_and_refresh_members(ctx, namespace, pool, 0, logger)
        except (KubeError, kopf.TemporaryError) as error:  # events are not retried by kopf; the drift timer catches up
            logger.warning(f"could not refresh ModelPool {namespace}/{pool} after a Deployment event: {error}")
