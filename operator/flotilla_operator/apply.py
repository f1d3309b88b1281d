"""Apply desired children: decide per child whether to create, replace or leave it, then do it.

The decision (`plan_child`) is pure. A live object "matches" when every field we set has our
value, so fields the API server defaults (imagePullPolicy, clusterIP, ...) never cause churn.
A mismatch replaces the spec in place (PUT with the live resourceVersion): the Deployment rolls
its pods, and no child is ever deleted to be changed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flotilla_operator.kube import KubeClient, KubeError
from flotilla_operator.manifests import child_selector

PLURALS = {
    ("v1", "Service"): "services",
    ("apps/v1", "Deployment"): "deployments",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors",
}
# Fields the API server allocates on a Service and refuses to have changed.
SERVICE_ALLOCATED = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "internalTrafficPolicy")


def is_subset(desired: Any, live: Any) -> bool:
    """Every value in `desired` is in `live`; lists must match element by element."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and is_subset(v, live[k]) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(desired) == len(live) and all(map(is_subset, desired, live))
    return desired == live


@dataclass(frozen=True)
class ChildPlan:
    action: str  # "create", "replace" or "keep"
    body: dict[str, Any]


def plan_child(desired: dict[str, Any], live: dict[str, Any] | None) -> ChildPlan:
    if live is None:
        return ChildPlan("create", desired)
    if is_subset(desired, live):
        return ChildPlan("keep", live)
    body = copy.deepcopy(desired)
    meta, live_meta = body["metadata"], live.get("metadata", {})
    meta["resourceVersion"] = live_meta.get("resourceVersion")
    meta["labels"] = {**(live_meta.get("labels") or {}), **meta.get("labels", {})}
    if live_meta.get("annotations"):  # others' annotations (deployment revision, kubectl) stay
        meta["annotations"] = {**live_meta["annotations"], **meta.get("annotations", {})}
    if body["kind"] == "Service":
        for key in SERVICE_ALLOCATED:
            if key in (live.get("spec") or {}):
                body["spec"][key] = live["spec"][key]
    return ChildPlan("replace", body)


def plural_of(obj: dict[str, Any]) -> str:
    return PLURALS[(obj["apiVersion"], obj["kind"])]


async def apply_child(kube: KubeClient, desired: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Create or replace one child as needed; returns the action taken and the stored object."""
    api_version, plural = desired["apiVersion"], plural_of(desired)
    meta = desired["metadata"]
    live = await kube.get(api_version, plural, meta["namespace"], meta["name"])
    plan = plan_child(desired, live)
    if plan.action == "create":
        return "create", await kube.create(api_version, plural, meta["namespace"], plan.body)
    if plan.action == "replace":
        return "replace", await kube.replace(api_version, plural, meta["namespace"], meta["name"], plan.body)
    return "keep", plan.body


async def prune_children(kube: KubeClient, namespace: str, owner_name: str, owner_uid: str,
                         desired: Iterable[dict[str, Any]], kinds: Iterable[tuple[str, str]]) -> list[str]:
    """Delete our children of `kinds` that are no longer desired (e.g. the PDB after latency-first)."""
    keep = {(d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in desired}
    deleted = []
    for api_version, kind in kinds:
        plural = PLURALS[(api_version, kind)]
        try:
            items = await kube.list(api_version, plural, namespace, child_selector(owner_name))
        except KubeError as error:
            if error.status == 404:  # the API (e.g. monitoring.coreos.com) is not installed
                continue
            raise
        for item in items:
            name = item["metadata"]["name"]
            ours = any(ref.get("uid") == owner_uid for ref in item["metadata"].get("ownerReferences") or [])
            if ours and (api_version, kind, name) not in keep:
                await kube.delete(api_version, plural, namespace, name)
                deleted.append(f"{kind}/{name}")
    return deleted
