"""NOTES.txt is what users read after `helm install`: its example must be accepted by the CRD as shipped."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from tests.chart.render import CHART, NAMESPACE, RELEASE, helm
from tests.support.crd_schema import admit

CAPTURE = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include "flotilla/templates/NOTES.txt" . | quote }}\n'


def rendered_notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt rendered by helm (helm template skips it, so a copy of the chart wraps it in a ConfigMap)."""
    chart = tmp_path / "flotilla"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-notes-capture.yaml").write_text(CAPTURE)
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, "--show-only", "templates/zz-notes-capture.yaml"]
    for s in sets:
        args += ["--set", s]
    return yaml.safe_load(helm(*args).stdout)["data"]["notes"]


def crd_schema() -> dict:
    crd = yaml.safe_load((CHART / "crds" / "flotilla.dev_inferencemodels.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    return version["schema"]["openAPIV3Schema"]


def test_notes_example_is_an_inference_model_the_crd_admits(tmp_path: Path) -> None:
    notes = rendered_notes(tmp_path)
    (block,) = re.findall(r"<<'YAML'\n(.*?)\n\s*YAML\n", notes, re.S)
    example = yaml.safe_load(block)
    assert example["kind"] == "InferenceModel"
    admitted, errors = admit(crd_schema(), example)
    assert errors == []
    assert admitted["spec"]["model"] == example["spec"]["model"], "the CRD pruned part of the example"
    from flotilla_operator.server_args import PORT

    assert f'"model": "{example["spec"]["model"]["name"]}"' in notes
    assert f"port-forward service/{RELEASE}-gateway 8080:8080" in notes  # one base URL for the fleet
    assert f"http://{RELEASE}-gateway.{NAMESPACE}.svc:8080/v1" in notes
    direct = rendered_notes(tmp_path / "direct", "gateway.enabled=false")
    assert f"port-forward service/{example['metadata']['name']} {PORT}:{PORT}" in direct


def test_notes_follow_the_values(tmp_path: Path) -> None:
    notes = rendered_notes(tmp_path, "operator.watchNamespaces={team-a,team-b}", "podMonitor.enabled=true")
    assert "watches the namespaces team-a, team-b" in notes
    assert "Prometheus: the autoscaler" not in notes
    assert f"rollout status deployment/{RELEASE}" in notes
    assert "never upgrades them" in notes
