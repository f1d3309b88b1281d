"""A JSON schema of the Gateway API Inference Extension's `InferencePool`, `inference.networking.k8s.io/v1`, written
for Flotilla's tests from the published API reference, not copied from the project's CRD.

Source: kubernetes-sigs/gateway-api-inference-extension, `site-src/reference/spec.md` (the generated API reference
of package inference.networking.k8s.io/v1 at commit 0ceaae96910f4a90243e6f841a225fe5f912ed85: the v1 API of the
v1.0 releases, whose targetPorts holds one port and whose endpointPickerRef is required) and the Go types it is
generated from, `api/v1/inferencepool_types.go`. Later releases only relax it (up to 8 targetPorts, `appProtocol`,
and an optional endpointPickerRef from v1.5), so an object valid here is valid there too.

What it checks, field by field as the reference states: the required keys (spec.selector, spec.targetPorts,
spec.endpointPickerRef; matchLabels; Port.number; EndpointPickerRef.name), each field's type, the enums
(failureMode), the bounds (port numbers, list and map sizes, string lengths) and the patterns of label keys and
values, Group and Kind. One rule is CEL in the CRD and a predicate here: a Service referent needs its port. Unlike
an API server, which prunes unknown fields silently, the schema refuses them (additionalProperties: false), so a
field misspelt by the renderer fails the test instead of vanishing on apply.
"""

from __future__ import annotations

from typing import Any

import jsonschema

API_VERSION = "inference.networking.k8s.io/v1"
KIND = "InferencePool"

# the reference's validation patterns, verbatim
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
GROUP = {"type": "string", "minLength": 0, "maxLength": 253, "pattern": r"^$|" + DNS_SUBDOMAIN}
KIND_NAME = {"type": "string", "minLength": 1, "maxLength": 63, "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"}
OBJECT_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
LABEL_KEY = {"type": "string", "minLength": 1, "maxLength": 253,
             "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"}
LABEL_VALUE = {"type": "string", "minLength": 0, "maxLength": 63, "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
PORT = {"type": "object", "required": ["number"], "additionalProperties": False,
        "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}

SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": KIND},
        "metadata": {  # ObjectMeta, as far as a manifest to apply uses it
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 253, "pattern": DNS_SUBDOMAIN},
                "namespace": {"type": "string", "minLength": 1, "maxLength": 63},
                "labels": {"type": "object", "propertyNames": LABEL_KEY, "additionalProperties": LABEL_VALUE},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                "ownerReferences": {"type": "array", "items": {
                    "type": "object", "required": ["apiVersion", "kind", "name", "uid"],
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "name": {"type": "string"}, "uid": {"type": "string"},
                                   "controller": {"type": "boolean"}, "blockOwnerDeletion": {"type": "boolean"}}}},
            },
        },
        "spec": {  # InferencePoolSpec
            "type": "object",
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "additionalProperties": False,
            "properties": {
                "selector": {  # LabelSelector: matchLabels only, "to be compatible with Kubernetes Service selectors"
                    "type": "object",
                    "required": ["matchLabels"],
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object", "minProperties": 1, "maxProperties": 64,
                                                   "propertyNames": LABEL_KEY, "additionalProperties": LABEL_VALUE}},
                },
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 1, "items": PORT},
                "endpointPickerRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "group": {**GROUP, "default": ""},
                        "kind": {**KIND_NAME, "default": "Service"},
                        "name": OBJECT_NAME,
                        "port": PORT,
                        "failureMode": {"type": "string", "enum": ["FailOpen", "FailClose"], "default": "FailClose"},
                    },
                },
            },
        },
        "status": {"type": "object"},  # written by gateways, never by a manifest
    },
}


def rule_errors(obj: dict[str, Any]) -> list[str]:
    """The CRD's CEL rule on EndpointPickerRef, `self.kind != 'Service' || has(self.port)` after kind defaults to
    Service: a Service referent needs the port, the Service's port and not the EPP container's."""
    ref = (obj.get("spec") or {}).get("endpointPickerRef") or {}
    if ref.get("kind", "Service") == "Service" and "port" not in ref:
        return ["spec.endpointPickerRef: port is required when kind is 'Service' or unspecified (defaults to 'Service')"]
    return []


def validate(obj: dict[str, Any]) -> list[str]:
    """Every reason `obj` is not a valid v1 InferencePool (empty when it is); the rule runs only on a valid shape."""
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(obj)]
    return errors or rule_errors(obj)
