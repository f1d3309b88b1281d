"""The children of an adaptive model (`placement.policy: adaptive`), from the tier its status records.

Pure, like manifests.py, whose builders it reuses: a dedicated tier gets a latency-first model's children; the
pool tier gets a member's (its Service fronting the pool's pods; the pool's members file lists it). During a
move both tiers have children, and the Service follows the route (tier_moves.children): in-cluster clients of
status.endpoint then switch with the gateway.
"""

from __future__ import annotations

from typing import Any

from flotilla_operator.manifests import Owner, desired_children
from flotilla_operator.pool_manifests import build_member_service
from flotilla_operator.tier_moves import Children

# an adaptive model's children that its tier may make unwanted (pool tier: no Deployment, PDB or adapter list)
ADAPTIVE_PRUNABLE_KINDS = (("apps/v1", "Deployment"), ("policy/v1", "PodDisruptionBudget"),
                           ("networking.k8s.io/v1", "NetworkPolicy"), ("v1", "ConfigMap"))
DEDICATED_ONLY_KINDS = ("Deployment", "PodDisruptionBudget", "ConfigMap", "NetworkPolicy")


def adaptive_children(owner: Owner, default_image: str, monitoring: bool, tier: Children,
                      keep_deployment: bool) -> list[dict[str, Any]]:
    """The children of `owner` with `tier`'s membership, replicas and route; `keep_deployment`: a Deployment
    draining to zero stays (at 0 replicas) until its pods are gone, so the move can see them go."""
    children = []
    dedicated = tier.dedicated_replicas > 0 or keep_deployment
    for child in desired_children(owner, default_image, monitoring):
        kind = child["kind"]
        if kind == "Service" and tier.routed_to_pool:
            child = build_member_service(owner, default_image)
        elif kind == "ServiceMonitor" and tier.routed_to_pool:
            continue  # the pool's own ServiceMonitor scrapes the pods it would select
        elif kind in DEDICATED_ONLY_KINDS and not dedicated:
            continue
        elif kind == "Deployment":
            child["spec"]["replicas"] = tier.dedicated_replicas
        children.append(child)
    return children
