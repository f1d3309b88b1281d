"""The repository's InferenceModel examples and generated CRDs, loaded once for tests."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRD_PATH = ROOT / "crds" / "flotilla.dev_inferencemodels.yaml"
POOL_CRD_PATH = ROOT / "crds" / "flotilla.dev_modelpools.yaml"


def load_example(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@functools.cache
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@functools.cache
def pool_crd() -> dict[str, Any]:
    return yaml.safe_load(POOL_CRD_PATH.read_text())


def crd_schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
