"""Placement policy: the placement table of docs/placement.md (latency-first vs cost-first) as pod-template fields.

A pure function of the policy, the pods' selector labels, the GPU request and the user's
overrides. The manifest builders splice its result into the Deployment and decide the PDB from it.
User-given nodeSelector entries and tolerations are added on top of the policy's; a user-given
priorityClassName replaces the policy's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flotilla_contract.labels import PART_OF_LABEL, POOL_LABEL

from flotilla_operator.types import PlacementSpec

LATENCY_FIRST = "latency-first"
COST_FIRST = "cost-first"
ADAPTIVE = "adaptive"  # its dedicated replicas are placed latency-first; in its pool, the pool's placement holds

HOSTNAME_KEY = "kubernetes.io/hostname"
ZONE_KEY = "topology.kubernetes.io/zone"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"

PRIORITY_CLASS = {LATENCY_FIRST: "flotilla-latency-first", COST_FIRST: "flotilla-cost-first"}

DEDICATED_TOLERATIONS = ({"key": POOL_LABEL, "operator": "Equal", "value": "dedicated", "effect": "NoSchedule"},)
SPOT_TOLERATIONS = (
    {"key": POOL_LABEL, "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
)
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Placement:
    """The pod-template fields a placement decides, plus its disruption and rollout rules."""

    affinity: dict[str, Any]
    topology_spread_constraints: list[dict[str, Any]]
    tolerations: list[dict[str, Any]]
    node_selector: dict[str, str]
    priority_class_name: str
    pdb_min_available: int | None  # None: no PodDisruptionBudget
    rolling_update: dict[str, Any] = field(default_factory=dict)

    def pod_spec_fields(self) -> dict[str, Any]:
        """The fields to merge into a PodSpec (empty ones left out)."""
        fields: dict[str, Any] = {
            "affinity": self.affinity,
            "topologySpreadConstraints": self.topology_spread_constraints,
            "tolerations": self.tolerations,
            "nodeSelector": self.node_selector,
            "priorityClassName": self.priority_class_name,
        }
        return {key: value for key, value in fields.items() if value}


def _pool_preference(pools: tuple[str, ...]) -> dict[str, Any]:
    """Prefer (never require) the policy's node pool, so clusters without pools still schedule."""
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 50,
        "preference": {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": list(pools)}]},
    }]}}


def _latency_first(selector: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    affinity = _pool_preference(("dedicated",))
    affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": dict(selector)}, "topologyKey": HOSTNAME_KEY,
    }]}  # one replica per node: a node loss costs one replica, and replicas never share a GPU host
    spread = [{
        "maxSkew": 1, "topologyKey": ZONE_KEY, "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": dict(selector)},
    }]  # ScheduleAnyway: clusters without zone labels still schedule
    return affinity, spread, [dict(t) for t in DEDICATED_TOLERATIONS]


def _cost_first() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    affinity = _pool_preference(("spot", "shared"))
    affinity["podAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"labelSelector": {"matchLabels": {PART_OF_LABEL: "flotilla"}}, "topologyKey": HOSTNAME_KEY},
    }]}  # pack onto nodes already running Flotilla pods, so empty nodes can be released
    return affinity, [], [dict(t) for t in SPOT_TOLERATIONS]


def _merge_tolerations(base: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged = list(base)
    for toleration in extra:
        if toleration not in merged:
            merged.append(toleration)
    return merged


def render_placement(
    spec: PlacementSpec, selector: dict[str, str], gpus: int = 0, gpu_type: str | None = None
) -> Placement:
    """The placement of a model's pods; `selector` are the labels that select exactly its pods."""
    if spec.policy in (LATENCY_FIRST, ADAPTIVE):
        affinity, spread, tolerations = _latency_first(selector)
        pdb_min_available: int | None = 1
        rolling = {"maxSurge": 1, "maxUnavailable": 0}  # never dip below the serving capacity
    elif spec.policy == COST_FIRST:
        affinity, spread, tolerations = _cost_first()
        pdb_min_available = None
        rolling = {"maxSurge": 0, "maxUnavailable": 1}  # never rent an extra GPU for a rollout
    else:
        raise ValueError(f"placement.policy must be latency-first, cost-first or adaptive, got {spec.policy!r}")
    if gpus > 0:
        tolerations.append(dict(GPU_TOLERATION))
    node_selector = {GPU_PRODUCT_LABEL: gpu_type} if gpus > 0 and gpu_type else {}
    node_selector.update(spec.node_selector)
    user_tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    return Placement(
        affinity=affinity,
        topology_spread_constraints=spread,
        tolerations=_merge_tolerations(tolerations, user_tolerations),
        node_selector=node_selector,
        priority_class_name=spec.priority_class_name or PRIORITY_CLASS[LATENCY_FIRST if spec.policy == ADAPTIVE else spec.policy],
        pdb_min_available=pdb_min_available,
        rolling_update=rolling,
    )
