"""ConfigMap volumes for the pod runner: what the kubelet does for a container that mounts a ConfigMap as a directory.

A ModelPool's servers read their members from a ConfigMap mounted at /etc/flotilla/pool, and re-read it when
the operator changes it (docs/pools.md, "Membership"). Each replica here gets its own directory per such
volume, filled with the ConfigMap's keys and refreshed on every sync; each file is written aside and renamed
into place, so a reader never sees half a file (the kubelet swaps a whole directory, to the same effect).
The container's arguments name the mount path; `rewrite_args` points them at the replica's directory.
"""

from __future__ import annotations

import os
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


def rewrite_args(argv: list[str], mounts: dict[str, tuple[Path, str]]) -> list[str]:
    """Arguments under a mount path now name the same file in the replica's directory."""
    out = []
    for arg in argv:
        for mount_path, (directory, _) in mounts.items():
            if arg == mount_path or arg.startswith(mount_path.rstrip("/") + "/"):
                arg = str(directory) + arg[len(mount_path.rstrip("/")):]
                break
        out.append(arg)
    return out


def refresh(api: httpx.Client, namespace: str, mounts: dict[str, tuple[Path, str]],
            cache: dict[str, dict[str, str] | None]) -> None:
    """Write each ConfigMap's keys into its directory where they changed; `cache` holds this sync's reads."""
    for directory, name in mounts.values():
        if name not in cache:
            response = api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
            cache[name] = (response.json().get("data") or {}) if response.status_code == 200 else None
        data = cache[name]
        if data is None:
            continue  # not created yet: the kubelet would wait too
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            target = directory / key
            if target.exists() and target.read_text() == text:
                continue
            aside = directory / f".{key}.tmp"
            aside.write_text(text)
            os.replace(aside, target)
