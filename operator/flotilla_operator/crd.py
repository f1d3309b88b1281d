"""Build the InferenceModel CustomResourceDefinition from the pydantic types, as controller-gen would.

Kubernetes wants a *structural* OpenAPI v3 schema: every node typed, no `$ref`, no `anyOf` for
optional fields, `exclusiveMinimum` as a boolean. Pydantic emits JSON Schema 2020-12, so this
module rewrites one into the other; nothing is edited by hand afterwards.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from flotilla_operator import types

# Keys a structural schema node may carry; everything else pydantic emits (title, ...) is dropped.
KEPT_KEYS = (
    "description", "type", "format", "enum", "default", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "maxProperties", "required",
    "x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields",
)


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-schema node as a structural OpenAPI v3 node (recursively)."""
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}  # the property's own description/default win over the model's
    if "anyOf" in node:  # Optional[X]: the field may be absent, it is never null
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express a union of {branches} structurally")
        inner = structural(branches[0], defs)
        node = {**inner, **{k: v for k, v in node.items() if k != "default" or v is not None}}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", "") is None:
        del node["default"]
    for bound in ("Minimum", "Maximum"):  # JSON Schema 2020 number → OpenAPI 3.0 flag
        key = f"exclusive{bound}"
        if isinstance(node.get(key), int | float) and not isinstance(node.get(key), bool):
            node[bound.lower()] = node[key]
            node[key] = True
    # copies: a model referenced twice must not share lists with itself, or YAML would write anchors
    out: dict[str, Any] = {key: copy.deepcopy(node[key]) for key in KEPT_KEYS if key in node}
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {}
        for name, prop in node["properties"].items():
            child = structural(prop, defs)
            optional_object = child.get("type") == "object" and name not in node.get("required", ())
            if optional_object and "default" not in child and _all_defaulted(prop, defs):
                child["default"] = {}  # lets the API server fill the nested defaults
            out["properties"][name] = child
    if "items" in node:
        out["items"] = structural(node["items"], defs)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(node["additionalProperties"], defs)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _all_defaulted(prop: dict[str, Any], defs: dict[str, Any]) -> bool:
    """Whether a model property can be defaulted to `{}` (it has no required fields)."""
    ref = prop.get("$ref")
    return ref is not None and not defs[ref.rsplit("/", 1)[-1]].get("required")


def model_schema(model: type[types.ApiModel]) -> dict[str, Any]:
    """The structural schema of one pydantic model."""
    raw = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    return structural(raw, raw.get("$defs", {}))


@dataclass(frozen=True)
class Kind:
    """What differs between Flotilla's kinds; every other part of their definitions is the same."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    description: str  # of the object
    spec: type[types.ApiModel]
    spec_description: str
    status: type[types.ApiModel]
    printer_columns: tuple[dict[str, str], ...]


def open_api_schema(kind: Kind) -> dict[str, Any]:
    """The whole object's schema: spec (defaulted, validated) and status (written by the operator)."""
    spec = {"description": kind.spec_description, **model_schema(kind.spec)}
    status = {
        "description": "status is what the operator observed; users never write it.",
        **model_schema(kind.status),
    }
    return {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def build_crd(kind: Kind) -> dict[str, Any]:
    """The CustomResourceDefinition manifest of one kind, with the scale subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{types.GROUP}",
            "labels": {"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/part-of": "flotilla"},
        },
        "spec": {
            "group": types.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": ["flotilla"],
            },
            "versions": [
                {
                    "name": types.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": open_api_schema(kind)},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": list(kind.printer_columns),
                }
            ],
        },
    }


INFERENCE_MODEL = Kind(
    kind=types.KIND, plural=types.PLURAL, singular=types.SINGULAR, short_names=tuple(types.SHORT_NAMES),
    description="InferenceModel is a fleet of flotilla-server replicas serving one model.",
    spec=types.InferenceModelSpec,
    spec_description="spec is what the user wants: the model, its hardware, scaling and placement.",
    status=types.InferenceModelStatus,
    printer_columns=(
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
        {"name": "Policy", "type": "string", "jsonPath": ".spec.placement.policy"},
        {"name": "Pool", "type": "string", "jsonPath": ".status.pool"},
        {"name": "Tier", "type": "string", "jsonPath": ".status.tier"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Queue", "type": "integer", "jsonPath": ".status.autoscaler.queueDepth"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Message", "type": "string", "jsonPath": ".status.message"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
)
