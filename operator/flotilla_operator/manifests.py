"""Pure builders: one InferenceModel in, the manifests of its children out.

Nothing here talks to the API. The reconciler compares these dicts with what exists and applies
the difference, so the same function serves create, update, resume and drift correction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flotilla_contract.labels import (
    COMPONENT_LABEL,
    ENGINE_TYPE_LABELS,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    MODEL_LABEL,
    NAME_LABEL,
    PART_OF_LABEL,
    SERVER_APP_NAME,
    VERSION_LABEL,
)

from flotilla_operator import types
from flotilla_operator.adapters import LIST_KEY, adapter_list_file, render_adapters
from flotilla_operator.model_source import render_source
from flotilla_operator.network_policy import build_network_policy
from flotilla_operator.placement import GPU_RESOURCE, render_placement
from flotilla_operator.server_args import PORT, render_server_args
from flotilla_operator.server_env import server_env

MANAGED_BY = "flotilla-operator"
RUN_AS_USER = 65532  # the non-root user both images create (docker/*.Dockerfile)
PROBE_PERIOD_S = 10
DRAIN_MARGIN_S = 15  # grace beyond the server's drain, for the process to exit after it


@dataclass(frozen=True)
class Owner:
    """The InferenceModel as its children see it."""

    name: str
    namespace: str
    uid: str
    spec: types.InferenceModelSpec

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": types.API_VERSION, "kind": types.KIND, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


def image_tag(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    return tail.split("@", 1)[0].split(":", 1)[1] if ":" in tail.split("@", 1)[0] else "latest"


def pod_selector(name: str) -> dict[str, str]:
    """The labels selecting the pods of the InferenceModel `name`; immutable once a Deployment exists."""
    return {NAME_LABEL: SERVER_APP_NAME, INSTANCE_LABEL: name}


def pod_selector_string(name: str) -> str:
    return ",".join(f"{key}={value}" for key, value in pod_selector(name).items())


def selector_labels(owner: Owner) -> dict[str, str]:
    return pod_selector(owner.name)


def labels(owner: Owner, image: str) -> dict[str, str]:
    return {
        **selector_labels(owner),
        VERSION_LABEL: image_tag(image)[:63],
        COMPONENT_LABEL: "inference-server",
        PART_OF_LABEL: "flotilla",
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def child_selector(name: str) -> str:
    """Label selector of every child the operator made for the InferenceModel `name`."""
    return f"{INSTANCE_LABEL}={name},{MANAGED_BY_LABEL}={MANAGED_BY}"


def metadata(owner: Owner, image: str) -> dict[str, Any]:
    return {"name": owner.name, "namespace": owner.namespace, "labels": labels(owner, image),
            "ownerReferences": [owner.reference()]}


def desired_replicas(spec: types.InferenceModelSpec) -> int:
    """spec.replicas, clamped to the scaling bounds unless someone else owns scaling."""
    if spec.scaling.disabled:
        return spec.replicas
    return max(spec.scaling.min_replicas, min(spec.scaling.max_replicas, spec.replicas))


def endpoint(owner_name: str, namespace: str) -> str:
    return f"http://{owner_name}.{namespace}.svc.cluster.local:{PORT}/v1"


def _resources(spec: types.InferenceModelSpec) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    if spec.resources.gpus > 0:
        amounts[GPU_RESOURCE] = str(spec.resources.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _probe(path: str, period_s: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s,
            "failureThreshold": failures, "timeoutSeconds": 5}


def build_deployment(owner: Owner, default_image: str) -> dict[str, Any]:
    spec = owner.spec
    image = spec.image or default_image
    source = render_source(spec.model.source, image)
    adapters = render_adapters(spec.adapters, adapters_configmap_name(owner.name))
    placement = render_placement(spec.placement, selector_labels(owner), spec.resources.gpus, spec.resources.gpu_type)
    pod_labels = {**labels(owner, image), MODEL_LABEL: _label_value(spec.model.name), **ENGINE_TYPE_LABELS}
    startup_failures = math.ceil(source.startup_budget_s / PROBE_PERIOD_S)
    container = {
        "name": "server",
        "image": image,
        "args": render_server_args(spec, source.model_arg, adapters.args),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": server_env(spec.server),
        "resources": _resources(spec),
        "startupProbe": _probe("/healthz", PROBE_PERIOD_S, startup_failures),
        "readinessProbe": _probe("/readyz", 5, 2),
        "livenessProbe": _probe("/healthz", PROBE_PERIOD_S, 3),
        "securityContext": {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *source.mounts, *adapters.mounts],
    }
    if spec.resources.gpus > 0:
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    volumes = [{"name": "tmp", "emptyDir": {}}, *source.volumes, *adapters.volumes]
    if spec.resources.gpus > 0:  # NCCL and CUDA IPC need more than the default 64 MiB of /dev/shm
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": math.ceil(spec.server.drain_timeout_seconds) + DRAIN_MARGIN_S,
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
        **placement.pod_spec_fields(),
    }
    if source.init_containers or adapters.init_containers:
        pod_spec["initContainers"] = [*source.init_containers, *adapters.init_containers]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, image),
        "spec": {
            "replicas": desired_replicas(spec),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": source.startup_budget_s + 300,
            "selector": {"matchLabels": selector_labels(owner)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": placement.rolling_update},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": pod_spec,
            },
        },
    }


def _label_value(text: str) -> str:
    """A label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:63]
    return cleaned.strip("._-") or "model"


def adapters_configmap_name(owner_name: str) -> str:
    return f"{owner_name}-adapters"


def build_adapters_configmap(owner: Owner, default_image: str) -> dict[str, Any] | None:
    """The `--lora-list-file` of the model's pods (adapters.py); None without adapters. Its content is never in
    the pod template, so changing it restarts nothing: the kubelet updates the mounted file in place."""
    if not owner.spec.adapters:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**metadata(owner, owner.spec.image or default_image), "name": adapters_configmap_name(owner.name)},
        "data": {LIST_KEY: adapter_list_file(owner.spec.adapters)},
    }


def build_service(owner: Owner, default_image: str) -> dict[str, Any]:
    image = owner.spec.image or default_image
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, image),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pdb(owner: Owner, default_image: str) -> dict[str, Any] | None:
    spec = owner.spec
    placement = render_placement(spec.placement, selector_labels(owner), spec.resources.gpus, spec.resources.gpu_type)
    if placement.pdb_min_available is None:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, spec.image or default_image),
        "spec": {"minAvailable": placement.pdb_min_available, "selector": {"matchLabels": selector_labels(owner)}},
    }


def build_service_monitor(owner: Owner, default_image: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(owner, owner.spec.image or default_image),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner)},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def desired_children(owner: Owner, default_image: str, monitoring: bool) -> list[dict[str, Any]]:
    """Every child that should exist, in apply order (the Service before the pods it fronts)."""
    children = [build_service(owner, default_image)]
    if (adapter_list := build_adapters_configmap(owner, default_image)) is not None:
        children.append(adapter_list)  # before the pods that mount it
    children.append(build_deployment(owner, default_image))
    if (pdb := build_pdb(owner, default_image)) is not None:
        children.append(pdb)
    meta = metadata(owner, owner.spec.image or default_image)
    if (policy := build_network_policy(owner.spec.network_policy, meta, selector_labels(owner))) is not None:
        children.append(policy)
    if monitoring:
        children.append(build_service_monitor(owner, default_image))
    return children
