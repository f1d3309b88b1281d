"""Every rendered manifest must be one the API server accepts, for the oldest and newest supported Kubernetes.

Built-in kinds (and the CRD object itself) go through `kubernetes-validate --strict`. The
prometheus-operator kinds have no schema there, so each is checked three ways instead:
- its metadata against the Kubernetes ObjectMeta schema bundled with kubernetes-validate (strict);
- its whole body against prometheus-operator's own CRD schema, as generated into the
  cloudcoil-models-prometheus-operator pydantic models: types must validate, and a round trip must
  lose nothing, which catches any field the CRD does not define;
- a PrometheusRule's groups with `promtool check rules` (PromQL syntax, templates, durations).
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring_v1
from referencing import Registry, Resource

from tests.chart.render import REPO_ROOT, render
from tests.support import crd_schema

KUBERNETES_VERSIONS = ("1.30", "1.37")
PEERING_KINDS = {d["spec"]["names"]["kind"]: d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                 for d in yaml.safe_load_all((REPO_ROOT / "crds" / "kopf.dev_peerings.yaml").read_text()) if d}
MONITORING_KINDS = {
    "PodMonitor": monitoring_v1.PodMonitor,
    "ServiceMonitor": monitoring_v1.ServiceMonitor,
    "PrometheusRule": monitoring_v1.PrometheusRule,
}


def test_bundled_schemas_cover_both_versions() -> None:
    bundled = {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()}
    assert set(KUBERNETES_VERSIONS) <= bundled, f"kubernetes-validate bundles {sorted(bundled)}"


def manifest_id(doc: dict) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_name", ["default", "all-options"])
def test_builtin_kinds_pass_kubernetes_validate_strict(values_name: str, version: str) -> None:
    checked = []
    for doc in render(values_name):
        if doc["kind"] in MONITORING_KINDS:
            continue
        if doc["kind"] in PEERING_KINDS:  # kopf's own kinds: checked against their CRD's schema
            schema = PEERING_KINDS[doc["kind"]]
            assert crd_schema.validate(schema, doc) == [] and crd_schema.prune(schema, doc) == doc, manifest_id(doc)
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{manifest_id(doc)} is invalid for Kubernetes {version}: {error.message} "
                        f"at {'.'.join(map(str, error.path))}")
        except kubernetes_validate.SchemaNotFoundError as error:
            pytest.fail(f"{manifest_id(doc)}: {error.message}; add a validation route for this kind")
        checked.append(doc["kind"])
    assert {"Deployment", "ClusterRole", "CustomResourceDefinition"} <= set(checked)


def test_strict_validation_rejects_an_unknown_field() -> None:
    """Guards the guard: a typo in a template must fail the check above."""
    deployment = next(d for d in render("default") if d["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.37", strict=True)


@cache
def object_meta_validator(version: str) -> jsonschema.Draft202012Validator:
    schema_dir = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    definitions = json.loads((schema_dir / "_definitions.json").read_text())
    registry = Resource.from_contents(definitions) @ Registry()
    ref = f"{definitions['$id']}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    return jsonschema.Draft202012Validator({"$ref": ref}, registry=registry)


def monitoring_docs(values_name: str) -> list[dict]:
    return [d for d in render(values_name) if d["kind"] in MONITORING_KINDS]


def test_all_options_render_every_monitoring_kind() -> None:
    assert sorted(d["kind"] for d in monitoring_docs("all-options")) == sorted(MONITORING_KINDS)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_monitoring_metadata_is_valid_object_meta(version: str) -> None:
    assert list(object_meta_validator(version).iter_errors({"name": "x", "labelz": {}})), "ObjectMeta check is not strict"
    for doc in monitoring_docs("all-options"):
        errors = [e.message for e in object_meta_validator(version).iter_errors(doc["metadata"])]
        assert not errors, f"{manifest_id(doc)} metadata: {errors}"


def round_trip(doc: dict) -> dict:
    model = MONITORING_KINDS[doc["kind"]].model_validate(doc)
    return model.model_dump(by_alias=True, exclude_unset=True, mode="json")


def test_monitoring_kinds_match_the_prometheus_operator_schema() -> None:
    for doc in monitoring_docs("all-options"):
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert round_trip(doc) == doc, f"{manifest_id(doc)} has fields the prometheus-operator CRD does not define"


def test_round_trip_catches_an_unknown_monitoring_field() -> None:
    """Guards the guard: the models drop unknown fields, so the comparison above must see the loss."""
    pod_monitor = next(d for d in monitoring_docs("all-options") if d["kind"] == "PodMonitor")
    broken = json.loads(json.dumps(pod_monitor))
    broken["spec"]["podMetricsEndpoints"][0]["intervall"] = "5s"
    assert round_trip(broken) != broken


def test_prometheus_rule_groups_pass_promtool(tmp_path: Path) -> None:
    rule = next(d for d in monitoring_docs("all-options") if d["kind"] == "PrometheusRule")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    from tests.chart.test_alerts import ALERTS

    assert f"SUCCESS: {len(ALERTS) + 2} rules found" in result.stdout  # and the two class SLOs recorded from values
