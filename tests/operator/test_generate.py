"""`make generate`: fresh, idempotent, structural, valid for Kubernetes 1.30 and 1.37."""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
from flotilla_operator import generate

from tests.support.examples import ROOT, crd, crd_schema


def test_committed_generated_files_are_fresh():
    assert generate.stale_files() == [], "generated files are stale: run `make generate`"


def test_generation_is_idempotent(tmp_path):
    assert generate.rendered_files() == generate.rendered_files()
    assert sorted(generate.write_files(tmp_path)) == sorted(generate.rendered_files())
    assert generate.write_files(tmp_path) == []  # the second run has nothing to write
    assert generate.stale_files(tmp_path) == []


def test_check_mode_fails_on_a_stale_file(tmp_path):
    generate.write_files(tmp_path)
    (tmp_path / generate.CRD_PATHS[0]).write_text("# edited by hand\n")
    assert generate.stale_files(tmp_path) == [generate.CRD_PATHS[0]]
    result = subprocess.run([sys.executable, "-m", "flotilla_operator.generate", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr  # the repository itself is fresh


def test_chart_copy_is_identical():
    first, second = (ROOT / path for path in generate.CRD_PATHS)
    assert first.read_text() == second.read_text()


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_crd_passes_kubernetes_validate_strict(version):
    kubernetes_validate.validate(crd(), version, strict=True)


def _walk(node, path="openAPIV3Schema"):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    for path, node in _walk(crd_schema()):
        assert "type" in node, f"{path} has no type"
        assert not {"$ref", "anyOf", "oneOf", "allOf", "const", "title"} & set(node), f"{path} is not structural"
        if node.get("type") == "object" and path.count(".") >= 2:
            assert node.get("properties") or node.get("additionalProperties") or \
                node.get("x-kubernetes-preserve-unknown-fields"), f"{path} is an object with no shape"


def test_every_spec_field_has_a_description_starting_with_its_name():
    for path, node in _walk(crd_schema()["properties"]["spec"], "spec"):
        name = path.rsplit(".", 1)[-1].rstrip("[]{}")
        if path != "spec" and not path.endswith(("[]", "{}")):  # items and map values are described by their field
            assert node.get("description", "").startswith(name), f"{path}: {node.get('description')!r}"


def test_crd_has_subresources_columns_and_short_name():
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Model", "Policy", "Desired", "Ready", "Queue", "Age"} <= set(columns)
    assert crd()["spec"]["names"]["shortNames"] == ["im"]


def test_operator_doc_covers_every_spec_field_and_condition():
    doc = (ROOT / generate.OPERATOR_DOC).read_text()
    for path, _ in _walk(crd_schema()["properties"]["spec"], "spec"):
        if not path.endswith(("{}", "[]")):
            assert f"`{path}`" in doc, path
    for condition in ("Ready", "Progressing", "Degraded", "ScalingActive"):
        assert f"`{condition}`" in doc
    assert "--drift-interval-s" in doc
