"""LoRA adapters (`spec.adapters`): where each one's PEFT directory lies in a pod, and what puts it there.

Pure builders (docs/operator.md, "Adapters"). A dedicated model's adapters are lines of a ConfigMap the server
follows as `--lora-list-file`, mounted as a directory (never with subPath), so the kubelet updates the file in
place and the server re-reads it within a second: adding or removing an adapter whose claim is already mounted
changes the ConfigMap only and restarts no pod. What does change the pod template, and so rolls the pods:
- the first adapter (or the removal of the last): the list file's flag and volume appear (or go);
- a `pvc` adapter on a claim no other adapter uses yet (each distinct claim is mounted once, read-only,
  at /adapters/pvc/CLAIM), and the removal of the last adapter on a claim;
- any `image` adapter added, changed or removed: it is copied by an init container into an emptyDir.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flotilla_contract.model_list import ListEntry, entry_problem

from flotilla_operator.model_source import INIT_SECURITY
from flotilla_operator.server_args import flag
from flotilla_operator.types import AdapterSpec

ADAPTERS_DIR = "/adapters"
CLAIMS_DIR = f"{ADAPTERS_DIR}/pvc"  # each distinct claim at CLAIMS_DIR/CLAIM
IMAGES_DIR = f"{ADAPTERS_DIR}/image"  # each image adapter copied to IMAGES_DIR/NAME
LIST_DIR = "/etc/flotilla/adapters"
LIST_KEY = "adapters"
LIST_FILE = f"{LIST_DIR}/{LIST_KEY}"
LIST_VOLUME = "adapter-list"
IMAGES_VOLUME = "adapter-images"


def claim_volume_name(claim: str) -> str:
    """A volume name for an adapter claim: stable for the claim (a hash, since a claim name may be 253 long)."""
    return "adapter-claim-" + hashlib.sha256(claim.encode()).hexdigest()[:12]


def claim_mount_path(claim: str) -> str:
    return f"{CLAIMS_DIR}/{claim}"


def _join(base: str, sub: str) -> str:
    sub = sub.strip("/")
    return f"{base}/{sub}" if sub else base


def adapter_path(adapter: AdapterSpec) -> str:
    """Where the server finds the adapter's PEFT directory in a dedicated model's pod."""
    if adapter.source.pvc is not None:
        return _join(claim_mount_path(adapter.source.pvc.claim_name), adapter.source.pvc.path)
    return f"{IMAGES_DIR}/{adapter.name}"


def adapter_claims(adapters: Iterable[AdapterSpec]) -> list[str]:
    """The distinct claims of the `pvc` adapters, sorted: each is mounted once."""
    return sorted({a.source.pvc.claim_name for a in adapters if a.source.pvc is not None})


def claim_volumes(claims: Iterable[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, server mounts) of adapter claims, each read-only at CLAIMS_DIR/CLAIM."""
    volumes, mounts = [], []
    for claim in claims:
        name = claim_volume_name(claim)
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": claim_mount_path(claim), "readOnly": True})
    return volumes, mounts


def adapter_list_file(adapters: Iterable[AdapterSpec]) -> str:
    """The `--lora-list-file` of a dedicated model: one `NAME=SOURCE` line per adapter, in spec order.

    ValueError for an adapter line the server would refuse (the CRD's patterns make that impossible)."""
    lines = []
    for adapter in adapters:
        entry = ListEntry(adapter.name, adapter_path(adapter))
        problem = entry_problem(entry.name, entry.source)
        if problem is not None:
            raise ValueError(f"adapter {adapter.name!r}: {problem}")
        lines.append(entry.line() + "\n")
    return "".join(lines)


@dataclass(frozen=True)
class AdapterRender:
    """What a dedicated model's pod needs for its adapters; empty when it has none."""

    args: list[str] = field(default_factory=list)  # the server's flags
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)  # into the server container
    init_containers: list[dict[str, Any]] = field(default_factory=list)


def render_adapters(adapters: list[AdapterSpec], configmap_name: str) -> AdapterRender:
    """The pod's part of `adapters`: the list file's ConfigMap mounted as a directory, each claim once, and one
    init container per image adapter copying its directory into an emptyDir."""
    if not adapters:
        return AdapterRender()
    volumes: list[dict[str, Any]] = [{"name": LIST_VOLUME, "configMap": {"name": configmap_name}}]
    mounts: list[dict[str, Any]] = [{"name": LIST_VOLUME, "mountPath": LIST_DIR, "readOnly": True}]
    claim_vols, claim_mounts = claim_volumes(adapter_claims(adapters))
    volumes += claim_vols
    mounts += claim_mounts
    images = [a for a in adapters if a.source.image is not None]
    init_containers = []
    if images:
        volumes.append({"name": IMAGES_VOLUME, "emptyDir": {}})
        mounts.append({"name": IMAGES_VOLUME, "mountPath": IMAGES_DIR, "readOnly": True})
        for i, adapter in enumerate(images):
            image = adapter.source.image
            assert image is not None
            init_containers.append({
                "name": f"copy-adapter-{i}", "image": image.reference,
                "command": ["cp", "-R", _join("", image.path), adapter_path(adapter)],
                "volumeMounts": [{"name": IMAGES_VOLUME, "mountPath": IMAGES_DIR}],
                "securityContext": dict(INIT_SECURITY),
            })
    return AdapterRender(flag("--lora-list-file", LIST_FILE), volumes, mounts, init_containers)
