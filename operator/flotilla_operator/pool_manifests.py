"""Pure builders: one ModelPool and its members in, the pool's children out (Service, ConfigMap, Deployment, PDB).

Membership lives only in the ConfigMap, mounted as a directory the servers re-read: the pod template
never mentions a member (no list in the arguments, no content hash in an annotation), so adding or
removing a member changes one ConfigMap and restarts nothing (docs/pools.md, "Membership").
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
    MODEL_POOL_LABEL,
    NAME_LABEL,
    PART_OF_LABEL,
    SERVER_APP_NAME,
    VERSION_LABEL,
    pool_child_name,
)
from flotilla_contract.sizes import parse_bytes

from flotilla_operator import pool_types, types
from flotilla_operator.adapters import claim_volumes
from flotilla_operator.manifests import (
    DRAIN_MARGIN_S,
    MANAGED_BY,
    PROBE_PERIOD_S,
    RUN_AS_USER,
    Owner,
    image_tag,
    metadata,
)
from flotilla_operator.manifests import _probe as probe
from flotilla_operator.manifests import _resources as resources  # reads only .resources, which a pool has too
from flotilla_operator.model_source import MODELS_DIR
from flotilla_operator.placement import render_placement
from flotilla_operator.pool_members import Member, adapter_claims, members_file
from flotilla_operator.server_args import PORT, class_values, flag, lora_values, server_dtype
from flotilla_operator.server_env import server_env

MEMBERS_DIR = "/etc/flotilla/pool"
MEMBERS_KEY = "models"
POOL_SERIES_LABEL = "pool"  # the label the pool's scrape gives its series (pool_prometheus selects on it)
POOL_STARTUP_BUDGET_S = 120  # a pool server starts empty: members load on demand, after readiness


@dataclass(frozen=True)
class PoolOwner:
    """The ModelPool as its children see it."""

    name: str
    namespace: str
    uid: str
    spec: pool_types.ModelPoolSpec

    @property
    def child_name(self) -> str:
        return pool_deployment_name(self.name)

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": types.API_VERSION, "kind": pool_types.KIND, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


def pool_deployment_name(pool_name: str) -> str:
    """Children are `NAME-pool` (flotilla_contract.labels.pool_child_name: the gateway reads the same rule)."""
    return pool_child_name(pool_name)


def pool_selector(pool_name: str) -> dict[str, str]:
    """The labels selecting the pods of ModelPool `pool_name`; immutable once its Deployment exists."""
    return {NAME_LABEL: SERVER_APP_NAME, INSTANCE_LABEL: pool_deployment_name(pool_name)}


def pool_selector_string(pool_name: str) -> str:
    return ",".join(f"{key}={value}" for key, value in pool_selector(pool_name).items())


def _image(owner: PoolOwner, default_image: str) -> str:
    return owner.spec.image or default_image


def _labels(owner: PoolOwner, image: str) -> dict[str, str]:
    return {**pool_selector(owner.name), MODEL_POOL_LABEL: owner.name, VERSION_LABEL: image_tag(image)[:63],
            COMPONENT_LABEL: "model-pool", PART_OF_LABEL: "flotilla", MANAGED_BY_LABEL: MANAGED_BY}


def _metadata(owner: PoolOwner, image: str, name: str | None = None) -> dict[str, Any]:
    return {"name": name or owner.child_name, "namespace": owner.namespace, "labels": _labels(owner, image),
            "ownerReferences": [owner.reference()]}


def members_configmap_name(pool_name: str) -> str:
    return f"{pool_deployment_name(pool_name)}-members"


def desired_pool_replicas(spec: pool_types.ModelPoolSpec) -> int:
    """spec.replicas, clamped to the scaling bounds unless someone else owns scaling."""
    if spec.scaling.disabled:
        return spec.replicas
    return max(spec.scaling.min_replicas, min(spec.scaling.max_replicas, spec.replicas))


# The server's own defaults when --memory-budget is unset (one GPU's memory, or the RAM on CPU). The operator
# renders the budget itself from these, so the servers and the autoscaler's memory floor use one figure, and
# on CPU it is a share of the pod's memory limit rather than of the node's RAM.
GPU_BUDGET_FRACTION = 0.8
CPU_BUDGET_FRACTION = 0.5


def budget_per_replica_bytes(spec: pool_types.ModelPoolSpec) -> int:
    """memoryBudget, else the server's default share: of one GPU's memory, or of the pod's memory on CPU."""
    if spec.memory_budget is not None:
        return parse_bytes(spec.memory_budget)
    if spec.resources.gpus > 0 and spec.resources.gpu_memory is not None:
        return math.floor(GPU_BUDGET_FRACTION * parse_bytes(spec.resources.gpu_memory))
    return math.floor(CPU_BUDGET_FRACTION * parse_bytes(spec.resources.memory))  # CEL: a GPU pool sizes one of both


def pool_server_args(spec: pool_types.ModelPoolSpec) -> list[str]:
    """The multi-model server's flags: the members file and the budget, never a member's name."""
    server, gpu = spec.server, spec.resources.gpus > 0
    values: list[tuple[str, object]] = [
        ("--host", "0.0.0.0"), ("--port", PORT),
        ("--max-num-seqs", server.max_num_seqs), ("--max-num-batched-tokens", server.max_batched_tokens),
        ("--prefill-chunk", server.prefill_chunk), ("--block-size", server.block_size),
        ("--queue-depth-per-slot", server.queue_depth_per_slot),
        ("--queue-timeout-s", float(server.queue_timeout_seconds)),
        ("--drain-timeout-s", float(server.drain_timeout_seconds)),
        ("--dtype", server_dtype(server, spec.resources.gpus)),
        ("--device", "cuda" if gpu else "cpu"),
    ]
    if server.max_model_len is not None:
        values.append(("--max-model-len", server.max_model_len))
    if server.quantization is not None:
        values.append(("--quantization", server.quantization))
    values += class_values(server)
    values += lora_values(server)
    # a member whose files are not on the volume yet is skipped, not fatal: it must not stop the others' pods
    values += [("--model-list-file", f"{MEMBERS_DIR}/{MEMBERS_KEY}"), ("--unreadable-model-at-start", "skip"),
               ("--memory-budget", budget_per_replica_bytes(spec))]
    args = [part for name, value in values for part in flag(name, value)]
    return args + list(server.extra_args)


def build_members_configmap(owner: PoolOwner, found: list[Member], default_image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, _image(owner, default_image), members_configmap_name(owner.name)),
        "data": {MEMBERS_KEY: members_file(found)},
    }


def build_pool_deployment(owner: PoolOwner, default_image: str, claims: list[str] | None = None) -> dict[str, Any]:
    """The pool's servers; `claims` are the members' adapter claims (pool_members.adapter_claims), each mounted
    read-only at /adapters/pvc/CLAIM: the one member-dependent part of the pod template, so an adapter on a
    claim the pool does not mount yet rolls the pool's pods once."""
    spec, image = owner.spec, _image(owner, default_image)
    gpu = spec.resources.gpus > 0
    placement = render_placement(spec.placement, pool_selector(owner.name), spec.resources.gpus, spec.resources.gpu_type)
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "members", "mountPath": MEMBERS_DIR, "readOnly": True}]
    # a ConfigMap mounted as a directory (never with subPath) is updated in place by the kubelet
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}},
                                     {"name": "members", "configMap": {"name": members_configmap_name(owner.name)}}]
    if spec.volume is not None:
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": spec.volume.claim_name, "readOnly": True}})
        mounts.append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
    claim_vols, claim_mounts = claim_volumes(claims or [])
    volumes += claim_vols
    mounts += claim_mounts
    if gpu:  # NCCL and CUDA IPC need more than the default 64 MiB of /dev/shm
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    container = {
        "name": "server", "image": image, "args": pool_server_args(spec),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": server_env(spec.server),
        "resources": resources(spec),  # type: ignore[arg-type]
        "startupProbe": probe("/healthz", PROBE_PERIOD_S, math.ceil(POOL_STARTUP_BUDGET_S / PROBE_PERIOD_S)),
        "readinessProbe": probe("/readyz", 5, 2),
        "livenessProbe": probe("/healthz", PROBE_PERIOD_S, 3),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": math.ceil(spec.server.drain_timeout_seconds) + DRAIN_MARGIN_S,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                            "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
        **placement.pod_spec_fields(),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, image),
        "spec": {
            "replicas": desired_pool_replicas(spec),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": POOL_STARTUP_BUDGET_S + 300,
            "selector": {"matchLabels": pool_selector(owner.name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": placement.rolling_update},
            "template": {"metadata": {"labels": {**_labels(owner, image), **ENGINE_TYPE_LABELS}}, "spec": pod_spec},
        },
    }


def build_pool_service(owner: PoolOwner, default_image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, _image(owner, default_image)),
        "spec": {"type": "ClusterIP", "selector": pool_selector(owner.name),
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]},
    }


def build_pool_pdb(owner: PoolOwner, default_image: str) -> dict[str, Any] | None:
    spec = owner.spec
    placement = render_placement(spec.placement, pool_selector(owner.name), spec.resources.gpus, spec.resources.gpu_type)
    if placement.pdb_min_available is None:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, _image(owner, default_image)),
        "spec": {"minAvailable": placement.pdb_min_available, "selector": {"matchLabels": pool_selector(owner.name)}},
    }


def build_pool_service_monitor(owner: PoolOwner, default_image: str) -> dict[str, Any]:
    """Scrapes the pool's servers, labelling their series `pool` (what the pool autoscaler selects on)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _metadata(owner, _image(owner, default_image)),
        "spec": {
            "selector": {"matchLabels": pool_selector(owner.name)},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s", "relabelings": [{
                "sourceLabels": ["__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in MODEL_POOL_LABEL)],
                "targetLabel": POOL_SERIES_LABEL}]}],
        },
    }


def desired_pool_children(owner: PoolOwner, found: list[Member], default_image: str,
                          monitoring: bool = False) -> list[dict[str, Any]]:
    """Every child the pool should have, in apply order (the members file before the pods that mount it)."""
    children = [build_pool_service(owner, default_image), build_members_configmap(owner, found, default_image),
                build_pool_deployment(owner, default_image, adapter_claims(found))]
    if (pdb := build_pool_pdb(owner, default_image)) is not None:
        children.append(pdb)
    if monitoring:
        children.append(build_pool_service_monitor(owner, default_image))
    return children


def build_member_service(owner: Owner, default_image: str) -> dict[str, Any]:
    """A pooled model's own Service: its usual endpoint, fronting its pool's pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, owner.spec.image or default_image),
        "spec": {"type": "ClusterIP", "selector": pool_selector(owner.spec.pool or ""),
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]},
    }
