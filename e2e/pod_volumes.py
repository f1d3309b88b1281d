"""ConfigMap volumes for the pod runner: what the kubelet does for a container that mounts a ConfigMap as a directory.

A ModelPool's servers read their members from a ConfigMap mounted at /etc/flotilla/pool, and re-read it when
the operator changes it (docs/pools.md, "Membership"). Each replica here gets its own directory per such
volume, filled with the ConfigMap's keys and refreshed on every sync; each file is written aside and renamed
into place, so a reader never sees half a file (the kubelet swaps a whole directory, to the same effect).
The container's arguments name the mount path; `rewrite_args` points them at the replica's directory.

PersistentVolumeClaim volumes stand for a directory on this machine that a test registers per claim
(`PodRunner.claims`: claim name → directory, for example a small model and its LoRA adapters): every pod
mounting the claim sees that one directory (with a mount's `subPath` under it). Arguments under such a mount
path, and paths under it written in a mounted ConfigMap's files (an adapter list file's `NAME=/adapters/pvc/...`
lines), are rewritten to the directory, as the container would find them at the mount path. A claim no test
registered is left alone (its paths stay as the template has them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx


def config_map_mounts(template: dict[str, Any], root: Path) -> dict[str, tuple[Path, str]]:
    """Mount path → (the replica's directory under `root`, ConfigMap name), for the first container."""
    spec = template.get("spec") or {}
    volumes = {v["name"]: v["configMap"]["name"] for v in spec.get("volumes") or [] if "configMap" in v}
    container = (spec.get("containers") or [{}])[0]
    return {m["mountPath"]: (root / m["name"], volumes[m["name"]])
            for m in container.get("volumeMounts") or [] if m.get("name") in volumes}


def claim_mounts(template: dict[str, Any], claims: Mapping[str, Path]) -> dict[str, Path]:
    """Mount path → the directory standing for its claim's volume (with the mount's subPath), for the first
    container's mounts of PersistentVolumeClaims registered in `claims` (claim name → directory)."""
    spec = template.get("spec") or {}
    volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes") or []
               if "persistentVolumeClaim" in v}
    container = (spec.get("containers") or [{}])[0]
    out = {}
    for m in container.get("volumeMounts") or []:
        claim = volumes.get(m.get("name"))
        if claim is not None and claim in claims:
            out[m["mountPath"]] = claims[claim] / (m.get("subPath") or "")
    return out


def rewrite_args(argv: list[str], mounts: dict[str, tuple[Path, str]],
                 claims: Mapping[str, Path] | None = None) -> list[str]:
    """Arguments under a mount path now name the same file in the replica's directory (a ConfigMap's) or the
    claim's directory (`claims`, from claim_mounts)."""
    directories = {mount_path: directory for mount_path, (directory, _) in mounts.items()} | dict(claims or {})
    out = []
    for arg in argv:
        for mount_path, directory in sorted(directories.items(), key=lambda item: -len(item[0])):
            if arg == mount_path or arg.startswith(mount_path.rstrip("/") + "/"):
                arg = str(directory) + arg[len(mount_path.rstrip("/")):]
                break
        out.append(arg)
    return out


def local_paths(text: str, claims: Mapping[str, Path]) -> str:
    """`text` with each path under a claim's mount path (starting a line, a word or a `NAME=` value) pointed at
    the claim's directory."""
    for mount_path, directory in sorted(claims.items(), key=lambda item: -len(item[0])):
        base = mount_path.rstrip("/")
        text = re.sub(rf"(?<![^\s=]){re.escape(base)}(?=/|\s|$)", lambda _, d=str(directory): d, text)
    return text


def refresh(api: httpx.Client, namespace: str, mounts: dict[str, tuple[Path, str]],
            cache: dict[str, dict[str, str] | None], claims: Mapping[str, Path] | None = None) -> None:
    """Write each ConfigMap's keys into its directory where they changed; `cache` holds this sync's reads.
    Paths under the mount paths of `claims` (claim_mounts) are written as the claims' directories."""
    for directory, name in mounts.values():
        if name not in cache:
            response = api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
            cache[name] = (response.json().get("data") or {}) if response.status_code == 200 else None
        data = cache[name]
        if data is None:
            continue  # not created yet: the kubelet would wait too
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            text = local_paths(text, claims) if claims else text
            target = directory / key
            if target.exists() and target.read_text() == text:
                continue
            aside = directory / f".{key}.tmp"
            aside.write_text(text)
            os.replace(aside, target)
