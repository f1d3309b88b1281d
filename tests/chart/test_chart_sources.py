"""The chart ships copies (CRD, dashboards, RBAC rules) of single sources; a copy that drifts fails here."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.chart.render import CHART, REPO_ROOT, one, render

CRD_NAMES = ("flotilla.dev_inferencemodels.yaml", "flotilla.dev_modelpools.yaml")
PEERING_CRDS = "kopf.dev_peerings.yaml"


def test_chart_crds_are_identical_to_the_generated_crds() -> None:
    for name in (*CRD_NAMES, PEERING_CRDS):
        chart_copy = CHART / "crds" / name
        source = REPO_ROOT / "crds" / name
        assert chart_copy.read_bytes() == source.read_bytes(), (
            f"{chart_copy.relative_to(REPO_ROOT)} differs from {source.relative_to(REPO_ROOT)}: run `make generate`"
        )
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == sorted((*CRD_NAMES, PEERING_CRDS))


def test_generated_chart_files_are_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "generate_chart_files.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_cluster_role_rules_are_the_operator_rbac_rules() -> None:
    docs = [d for d in yaml.safe_load_all((REPO_ROOT / "deploy" / "rbac.yaml").read_text()) if d]
    (source_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert one(render("default"), "ClusterRole")["rules"] == source_role["rules"]


def test_rendered_crds_are_the_source_crds() -> None:
    sources = [yaml.safe_load((REPO_ROOT / "crds" / name).read_text()) for name in CRD_NAMES]
    sources += [d for d in yaml.safe_load_all((REPO_ROOT / "crds" / PEERING_CRDS).read_text()) if d]
    rendered = sorted((d for d in render("default") if d["kind"] == "CustomResourceDefinition"),
                      key=lambda d: d["metadata"]["name"])
    assert rendered == sorted(sources, key=lambda d: d["metadata"]["name"])
