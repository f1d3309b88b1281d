"""The one way the operator writes an InferenceModel's status, with the one conflict-retry helper.

Two writers share `status` (the reconciler and the autoscaler; docs/architecture.md, "Status
ownership"). Each write is computed from the object just read and carries its resourceVersion, so
neither ever overwrites the other: on 409 Conflict, read again, compute again, write again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from flotilla_operator import types
from flotilla_operator.kube import KubeClient, KubeError

STATUS_WRITE_ATTEMPTS = 4
T = TypeVar("T")


async def retry_on_conflict(attempt: Callable[[], Awaitable[T]], what: str,
                            attempts: int = STATUS_WRITE_ATTEMPTS) -> T:
    """Run `attempt` (read, compute, write) again after each 409, at most `attempts` times."""
    for _ in range(attempts - 1):
        try:
            return await attempt()
        except KubeError as error:
            if error.status != 409:
                raise
    try:
        return await attempt()
    except KubeError as error:
        if error.status != 409:
            raise
        raise KubeError(409, "Conflict", f"{what} kept changing under us ({attempts} tries); the next pass retries") from error


# Given the freshly read object: the new status fields, or None to write nothing.
Compute = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


async def write_status(kube: KubeClient, namespace: str, name: str, compute: Compute,
                       plural: str = types.PLURAL) -> dict[str, Any] | None:
    """Read the object, compute its new status fields, patch them against that version; retry on conflict.

    `plural` is `inferencemodels` (the default) or `modelpools`: the pool's status is written the same way.

    Returns the status as it was before the write (None: the model is gone or being deleted).
    """
    async def attempt() -> dict[str, Any] | None:
        obj = await kube.get(types.API_VERSION, plural, namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        previous = obj.get("status") or {}
        new = await compute(obj)
        if new is not None:
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": new}
            await kube.patch(types.API_VERSION, plural, namespace, name, patch, subresource="status")
        return previous

    return await retry_on_conflict(attempt, f"status of {namespace}/{name}")
