"""`flotilla-operator render`: every example renders, with no cluster, to manifests Kubernetes accepts."""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from flotilla_operator import types
from flotilla_operator.manifests import Owner, desired_children

from tests.chart.test_manifests_valid import KUBERNETES_VERSIONS, round_trip
from tests.support.examples import EXAMPLES, ROOT, load_example


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flotilla_operator.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_to_valid_manifests(path):
    result = run_cli("render", "-f", str(path), "--service-monitor")
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    kinds = [doc["kind"] for doc in docs]
    # an adapter list ConfigMap, when the model has adapters, goes between: before the pods that mount it
    assert [k for k in kinds if k != "ConfigMap"][:2] == ["Service", "Deployment"] and kinds[-1] == "ServiceMonitor"
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # no schema in kubernetes-validate: prometheus-operator's own
            assert round_trip(doc) == doc
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_render_prints_what_the_operator_creates(path):
    result = run_cli("render", "-f", str(path))
    assert result.returncode == 0, result.stderr
    obj = load_example(path)
    owner = Owner(obj["metadata"]["name"], obj["metadata"]["namespace"], "", types.parse_spec(obj["spec"]))
    expected = desired_children(owner, types.DEFAULT_SERVER_IMAGE, monitoring=False)
    for child in expected:
        child["metadata"].pop("ownerReferences")  # no cluster, no uid to point at
    assert list(yaml.safe_load_all(result.stdout)) == expected


def test_a_given_uid_keeps_the_owner_reference_and_the_image_flag_applies(tmp_path):
    obj = load_example(ROOT / "examples" / "tiny-cpu.yaml")
    obj["metadata"]["uid"] = "5d1c1f3e-0000-4000-8000-000000000001"
    obj["spec"].pop("image", None)
    result = run_cli("render", "-f", "-", "--default-image", "registry.example/flotilla-server:9", stdin=yaml.safe_dump(obj))
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert all(d["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"] for d in docs)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/flotilla-server:9"


@pytest.mark.parametrize(("document", "message"), [
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "render takes InferenceModel and ModelPool manifests"),
    ("apiVersion: flotilla.dev/v1alpha1\nkind: InferenceModel\nmetadata: {name: x}\nspec: {replicas: -1}\n",
     "fix it and render again"),
    ("", "holds no YAML document"),
    ("a: [", "not valid YAML"),
])
def test_mistakes_exit_2_and_say_what_to_change(document, message):
    result = run_cli("render", "-f", "-", stdin=document)
    assert result.returncode == 2 and message in result.stderr and not result.stdout


def test_bare_flags_still_run_the_operator_and_help_names_render():
    result = run_cli("--help")
    assert result.returncode == 0 and "flotilla-operator render -f FILE.yaml" in result.stdout
    assert "give --namespace NAME" in run_cli().stderr  # bare: the operator's own flags, not render's
