"""Build the ModelPool CustomResourceDefinition from its pydantic types (crd.py's structural rewrite).

Its printer columns show membership and residency at a glance (`kubectl get mp`), and it carries the
scale subresource: the pool, not its members, is what scales (docs/pools.md).
"""

from __future__ import annotations

from typing import Any

from flotilla_operator import crd, pool_types, types


def open_api_schema() -> dict[str, Any]:
    spec = {
        "description": "spec is the pool's GPU shape, memory budget, shared volume, replica range and scaling.",
        **crd.model_schema(pool_types.ModelPoolSpec),
    }
    status = {
        "description": "status is what the operator observed; users never write it.",
        **crd.model_schema(pool_types.ModelPoolStatus),
    }
    return {
        "type": "object",
        "description": "ModelPool is one Deployment of multi-model flotilla-servers shared by cost-first InferenceModels.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


PRINTER_COLUMNS = [
    {"name": "Members", "type": "integer", "jsonPath": ".status.memberCount"},
    {"name": "Resident", "type": "integer", "jsonPath": ".status.residentCount"},
    {"name": "Budget", "type": "string", "jsonPath": ".spec.memoryBudget"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Queue", "type": "integer", "jsonPath": ".status.autoscaler.queueDepth"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    """The ModelPool CustomResourceDefinition manifest."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{pool_types.PLURAL}.{types.GROUP}",
            "labels": {"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/part-of": "flotilla"},
        },
        "spec": {
            "group": types.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": pool_types.KIND,
                "listKind": f"{pool_types.KIND}List",
                "plural": pool_types.PLURAL,
                "singular": pool_types.SINGULAR,
                "shortNames": list(pool_types.SHORT_NAMES),
                "categories": ["flotilla"],
            },
            "versions": [
                {
                    "name": types.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": open_api_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }
