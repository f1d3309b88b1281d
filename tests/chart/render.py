"""Runs the real helm v3 binary on the chart, so every chart test renders exactly what users install."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "flotilla"
ALL_OPTIONS = CHART / "ci" / "all-options-values.yaml"
VALUES_FILES = {"default": None, "all-options": ALL_OPTIONS}
RELEASE, NAMESPACE = "flotilla", "flotilla-system"


def helm_binary() -> str:
    """`.tools/bin/helm` as `make tools` installs it, else helm on PATH."""
    local = REPO_ROOT / ".tools" / "bin" / "helm"
    if local.is_file():
        return str(local)
    found = shutil.which("helm")
    if found is None:
        raise RuntimeError("helm is missing: run `make tools` (scripts/install-helm.sh .tools/bin)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
    return result


def template_args(values_file: Path | None, *sets: str, include_crds: bool = True) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if include_crds:
        args.append("--include-crds")
    if values_file is not None:
        args += ["-f", str(values_file)]
    for s in sets:
        args += ["--set", s]
    return args


@cache
def render(values_name: str, *sets: str) -> tuple[dict, ...]:
    """Every manifest `helm template` renders (CRDs included), parsed; cached per values and --set list."""
    out = helm(*template_args(VALUES_FILES[values_name], *sets)).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def by_kind(docs: tuple[dict, ...], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: tuple[dict, ...], kind: str, component: str = "operator") -> dict:
    """The one `kind` rendered; where the operator and the gateway each have one, the `component`'s."""
    found = by_kind(docs, kind)
    if len(found) > 1:
        found = [d for d in found if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]
