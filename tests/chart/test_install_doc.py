"""docs/install.md is followed literally: its helm commands run as written and render what it describes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.chart.render import REPO_ROOT, helm_binary

DOC = REPO_ROOT / "docs" / "install.md"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def helm_commands() -> list[str]:
    """The `helm lint` / `helm template` commands of the doc, continuation lines joined."""
    commands = []
    for block in code_blocks("sh"):
        for command in block.replace("\\\n", " ").splitlines():
            if re.match(r"helm (lint|template) ", command):
                commands.append(command)
    return commands


def run_documented_commands(workdir: Path) -> None:
    (workdir / "charts").symlink_to(REPO_ROOT / "charts")
    (values_file,) = [b for b in code_blocks("yaml") if "prometheusUrl" in b]
    (workdir / "kube-prometheus-stack-values.yaml").write_text(values_file)
    path = f"{Path(helm_binary()).parent}:/usr/bin:/bin"
    for command in helm_commands():
        result = subprocess.run(["bash", "-c", command], cwd=workdir, capture_output=True, text=True,
                                timeout=60, env={"PATH": path, "HOME": str(workdir)})
        assert result.returncode == 0, f"documented command failed: {command}\n{result.stderr}"


def objects(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def documented_default_objects() -> set[tuple[str, str]]:
    table = DOC.read_text().split("holds exactly these objects:", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    return {(kind.strip(), name.strip()) for kind, name in rows}


def test_the_doc_documents_lint_and_both_renders() -> None:
    commands = helm_commands()
    assert any(c.startswith("helm lint --strict charts/flotilla") for c in commands)
    assert sum(c.startswith("helm template") for c in commands) == 2


def test_documented_commands_render_what_the_doc_describes(tmp_path: Path) -> None:
    run_documented_commands(tmp_path)
    default = {(d["kind"], d["metadata"]["name"]) for d in objects(tmp_path / "flotilla.yaml")}
    assert default == documented_default_objects()

    monitoring = objects(tmp_path / "flotilla-monitoring.yaml")
    extra = {(d["kind"], d["metadata"]["name"]) for d in monitoring
             if d["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule")}
    assert extra == {("ServiceMonitor", "flotilla-operator"), ("PodMonitor", "flotilla-servers"),
                     ("PrometheusRule", "flotilla")}
    for doc in monitoring:
        if doc["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        if doc["kind"] == "ConfigMap":
            assert doc["metadata"]["namespace"] == "monitoring"
            assert doc["metadata"]["annotations"] == {"grafana_folder": "Flotilla"}


def test_doc_states_the_crd_upgrade_command() -> None:
    text = DOC.read_text()
    assert "never upgrades or\ndeletes them" in text or "never upgrades or deletes them" in text
    assert "kubectl apply --server-side -f charts/flotilla/crds/flotilla.dev_inferencemodels.yaml" in text
