"""The ModelPool kind as crd.py builds it: its types, its printer columns.

Its printer columns show membership and residency at a glance (`kubectl get mp`), and it carries the
scale subresource: the pool, not its members, is what scales (docs/pools.md).
"""

from __future__ import annotations

from flotilla_operator import crd, pool_types

MODEL_POOL = crd.Kind(
    kind=pool_types.KIND, plural=pool_types.PLURAL, singular=pool_types.SINGULAR,
    short_names=tuple(pool_types.SHORT_NAMES),
    description="ModelPool is one Deployment of multi-model flotilla-servers shared by cost-first InferenceModels.",
    spec=pool_types.ModelPoolSpec,
    spec_description="spec is the pool's GPU shape, memory budget, shared volume, replica range and scaling.",
    status=pool_types.ModelPoolStatus,
    printer_columns=(
        {"name": "Members", "type": "integer", "jsonPath": ".status.memberCount"},
        {"name": "Resident", "type": "integer", "jsonPath": ".status.residentCount"},
        {"name": "Budget", "type": "string", "jsonPath": ".spec.memoryBudget"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Queue", "type": "integer", "jsonPath": ".status.autoscaler.queueDepth"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
)
