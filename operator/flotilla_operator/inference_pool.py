"""The InferencePool of a model: how a gateway implementing the Gateway API Inference Extension (Istio, kgateway,
NGINX Gateway Fabric, GKE) reaches Flotilla's servers in place of flotilla-gateway (docs/inference-gateway.md).

Why render it: the pool is three facts the operator already knows (the pods' labels, the servers' port, and a
name for the endpoint picker), and writing them by hand drifts the day a selector changes. The builder is pure,
like manifests.py; `flotilla-operator render` prints it behind spec.gateway.inferencePool, and the user applies it
beside the endpoint picker (EPP) they deploy. The operator does not create it in the cluster.

Rules:
- the pool selects what the model's Service selects: its own pods, or its ModelPool's pods when it joins one (the
  pool's servers load it on demand), so the EPP and the Service always agree on the endpoints;
- targetPorts is the servers' one HTTP port, which also serves /metrics (the EPP scrapes the target port);
- the endpoint picker is the Service `NAME-epp` on port 9002 (the EPP's gRPC ext-proc port), FailClose: a
  gateway that cannot reach the picker refuses rather than route blind.
"""

from __future__ import annotations

from typing import Any

from flotilla_operator.manifests import Owner, metadata
from flotilla_operator.server_args import PORT

API_VERSION = "inference.networking.k8s.io/v1"
KIND = "InferencePool"
EPP_PORT = 9002  # the endpoint picker's ext-proc port, the inference extension's default
EPP_FAILURE_MODE = "FailClose"


def epp_service_name(owner_name: str) -> str:
    """The Service of the model's endpoint picker: `NAME-epp`, the name docs/inference-gateway.md deploys it under."""
    return f"{owner_name}-epp"


def build_inference_pool(owner: Owner, default_image: str, selector: dict[str, str]) -> dict[str, Any]:
    """The InferencePool for `owner`, selecting the pods `selector` matches (the model's Service's selector)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(owner, owner.spec.image or default_image),
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "targetPorts": [{"number": PORT}],
            "endpointPickerRef": {"kind": "Service", "name": epp_service_name(owner.name),
                                  "port": {"number": EPP_PORT}, "failureMode": EPP_FAILURE_MODE},
        },
    }


def with_inference_pool(owner: Owner, default_image: str, children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`children` and, when spec.gateway.inferencePool asks, the InferencePool selecting what their Service selects."""
    if not owner.spec.gateway.inference_pool:
        return children
    service = next(c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == owner.name)
    return [*children, build_inference_pool(owner, default_image, service["spec"]["selector"])]
