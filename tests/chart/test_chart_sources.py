"""The chart ships copies (CRD, dashboards, RBAC rules) of single sources; a copy that drifts fails here."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.chart.render import CHART, REPO_ROOT, one, render

CRD_NAME = "flotilla.dev_inferencemodels.yaml"
PEERING_CRDS = "kopf.dev_peerings.yaml"


def test_chart_crd_is_identical_to_the_generated_crd() -> None:
    chart_copy = CHART / "crds" / CRD_NAME
    source = REPO_ROOT / "crds" / CRD_NAME
    assert chart_copy.read_bytes() == source.read_bytes(), (
        f"{chart_copy.relative_to(REPO_ROOT)} differs from {source.relative_to(REPO_ROOT)}: run `make generate`"
    )
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [CRD_NAME, PEERING_CRDS]
    assert (CHART / "crds" / PEERING_CRDS).read_bytes() == (REPO_ROOT / "crds" / PEERING_CRDS).read_bytes()


def test_generated_chart_files_are_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "generate_chart_files.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_cluster_role_rules_are_the_operator_rbac_rules() -> None:
    docs = [d for d in yaml.safe_load_all((REPO_ROOT / "deploy" / "rbac.yaml").read_text()) if d]
    (source_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert one(render("default"), "ClusterRole")["rules"] == source_role["rules"]


def test_rendered_crd_is_the_source_crd() -> None:
    source = yaml.safe_load((REPO_ROOT / "crds" / CRD_NAME).read_text())
    rendered = [d for d in render("default") if d["kind"] == "CustomResourceDefinition"]
    assert [d for d in rendered if d["metadata"]["name"] == source["metadata"]["name"]] == [source]
    peering = [d for d in yaml.safe_load_all((REPO_ROOT / "crds" / PEERING_CRDS).read_text()) if d]
    assert sorted((d for d in rendered if d["metadata"]["name"] != source["metadata"]["name"]),
                  key=lambda d: d["metadata"]["name"]) == sorted(peering, key=lambda d: d["metadata"]["name"])
