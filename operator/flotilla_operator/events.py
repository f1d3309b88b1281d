"""The one way the operator posts core/v1 Events on an InferenceModel (`kubectl describe` shows them).

Through our own API client, so Events use the same credentials and the same log-in-again-on-401 as
every other write. Losing an Event is logged, never fatal: the status already says what happened.
"""

from __future__ import annotations

import logging
from typing import Any

from flotilla_operator import rfc3339, types
from flotilla_operator.kube import KubeClient, KubeError

COMPONENT = "flotilla-operator"
MAX_MESSAGE_CHARS = 1024  # the API server's limit on Event.message


def object_ref(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The InferenceModel an Event is about."""
    return {"apiVersion": types.API_VERSION, "kind": types.KIND, "name": name, "namespace": namespace, "uid": uid}


def event_body(ref: dict[str, Any], type_: str, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{ref['name']}.", "namespace": ref["namespace"]},
        "involvedObject": ref,
        "type": type_, "reason": reason, "message": message[:MAX_MESSAGE_CHARS],
        "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


async def post_event(kube: KubeClient, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """type_ is "Normal" or "Warning"; reason is CamelCase (Created, ScaledUp, ClaimNotFound)."""
    try:
        await kube.create("v1", "events", ref["namespace"], event_body(ref, type_, reason, message, rfc3339.now()))
    except KubeError as error:
        logging.getLogger(__name__).warning(f"could not post the {reason} event on {ref['name']}: {error}")
