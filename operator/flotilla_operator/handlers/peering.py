"""High availability: the liveness probe fails when the peering object a replica needs is missing.

With `--peering NAME`, kopf pauses every watcher until the peering object exists, and a paused
operator otherwise looks healthy while it reconciles nothing. Standing by (paused in favour of a
replica with a higher priority) is normal and keeps the probe passing; only a missing object fails
it, with a log line saying what to create (docs/operator.md, "High availability").
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from flotilla_operator import reconciler
from flotilla_operator.settings import OperatorSettings

PEERING_API_VERSION = "kopf.dev/v1"


def peering_objects(settings: OperatorSettings) -> list[tuple[str, str | None, str]]:
    """(plural, namespace, name) of every peering object kopf needs: one per watched namespace, or one cluster-wide."""
    if settings.peering is None:
        return []
    if settings.all_namespaces:
        return [("clusterkopfpeerings", None, settings.peering)]
    return [("kopfpeerings", namespace, settings.peering) for namespace in settings.namespaces]


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    wanted = peering_objects(settings)
    if not wanted:
        return  # standalone: nothing to coordinate, nothing to check

    @kopf.on.probe(id="peering", registry=registry)
    async def peering_present(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> str:
        ctx: reconciler.Context | None = getattr(memo, "ctx", None)
        if ctx is None:
            return "starting"
        for plural, namespace, name in wanted:
            if await ctx.kube.get(PEERING_API_VERSION, plural, namespace, name) is None:
                kind = "ClusterKopfPeering" if namespace is None else f'KopfPeering in namespace "{namespace}"'
                message = (f'peering object missing: {kind} "{name}" does not exist, so kopf pauses every watcher; '
                           f"create it (the Helm chart ships it with operator.peering.enabled) or run with --standalone")
                logger.error(message)
                raise kopf.PermanentError(message)
        return "present"
