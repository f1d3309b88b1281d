"""The NetworkPolicy of one model (`spec.networkPolicy`): its pods accept traffic only from
flotilla-gateway's pods and from Prometheus.

Without it, anyone who reaches a model's Service uses the model around the gateway's API keys
(docs/gateway.md, "Keys between the gateway and the servers"). Pure: the reconciler plans it like every
other child, so turning it off deletes it. It takes effect only where the cluster's network plugin enforces
NetworkPolicies.
"""

from __future__ import annotations

from typing import Any

from flotilla_operator import types
from flotilla_operator.server_args import PORT


def _peer(peer: types.NetworkPeer) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": dict(peer.namespace_labels)},
            "podSelector": {"matchLabels": dict(peer.pod_labels)}}


def build_network_policy(spec: types.NetworkPolicySpec, meta: dict[str, Any],
                         pods: dict[str, str]) -> dict[str, Any] | None:
    """The policy with the child metadata `meta`, guarding the pods labelled `pods`; None when disabled."""
    if not spec.enabled:
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": dict(pods)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [_peer(spec.gateway), _peer(spec.prometheus)],
                         "ports": [{"protocol": "TCP", "port": PORT}]}],
        },
    }
