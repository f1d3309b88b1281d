"""What the test API server serves: the kinds it knows, its errors, and its audit records.

Kept apart from the stateful server (`k8s_apiserver.py`) and from `serve()` (`k8s_emulator.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import kmock


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: tuple[str, ...] = ()
    scale_spec_path: str = ".spec.replicas"
    scale_status_path: str = ".status.replicas"
    scale_selector_path: str | None = None
    short_names: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None  # a CRD's openAPIV3Schema: defaulted and validated on writes

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN_KINDS = (
    Kind("", "v1", "namespaces", "Namespace", namespaced=False),
    Kind("", "v1", "events", "Event"),
    Kind("", "v1", "services", "Service", subresources=("status",)),
    Kind("", "v1", "secrets", "Secret"),
    Kind("", "v1", "configmaps", "ConfigMap"),
    Kind("", "v1", "pods", "Pod", subresources=("status",)),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", subresources=("status",)),
    Kind("", "v1", "serviceaccounts", "ServiceAccount"),
    Kind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    Kind("apps", "v1", "deployments", "Deployment", subresources=("status", "scale"),
         scale_selector_path=".spec.selector"),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", subresources=("status",)),
    Kind("events.k8s.io", "v1", "events", "Event"),
    Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
         namespaced=False, subresources=("status",)),
)
MONITORING_KINDS = (
    Kind("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor"),
    Kind("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"),
)
MAX_LOGGED_EVENTS = 20_000
NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "code": self.code, "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class AuditEntry:
    """One request as RBAC sees it: who (user agent), which verb, on what."""

    user_agent: str
    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    group: str
    resource: str  # plural, with "/subresource" when one was addressed
    namespace: str | None

    @classmethod
    def of(cls, request: kmock.Request) -> AuditEntry:
        method, named = request._raw_request.method, request.name is not None
        if method == "GET":
            verb = "watch" if request.params.get("watch") in ("true", "1") else ("get" if named else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete" if named else "deletecollection"}.get(method, method.lower())
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        return cls(request.headers.get("User-Agent", ""), verb, request.resource.group or "", resource, request.namespace)


def kind_from_crd(crd: dict[str, Any]) -> Kind:
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("storage", True))
    subresources = version.get("subresources", {})
    scale = subresources.get("scale", {})
    return Kind(
        spec["group"], version["name"], spec["names"]["plural"], spec["names"]["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        subresources=tuple(subresources),
        scale_spec_path=scale.get("specReplicasPath", ".spec.replicas"),
        scale_status_path=scale.get("statusReplicasPath", ".status.replicas"),
        scale_selector_path=scale.get("labelSelectorPath"),
        short_names=tuple(spec["names"].get("shortNames", ())),
        schema=version.get("schema", {}).get("openAPIV3Schema"),
    )


def _get_path(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.strip(".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.strip(".").split(".")
    node = obj
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


