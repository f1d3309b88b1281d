"""The Gateway API Inference Extension's side of the operator: every server pod carries the engine-type labels the
endpoint picker maps metrics by, and `render` emits, behind spec.gateway.inferencePool, an InferencePool valid
against the v1 API reference (tests/support/inference_pool_schema.py) that selects exactly the serving pods."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest
import yaml
from flotilla_contract.labels import GIE_ENGINE_TYPE_LABEL, LLMD_ENGINE_TYPE_LABEL
from flotilla_operator import pool_types, types
from flotilla_operator.inference_pool import EPP_PORT, epp_service_name
from flotilla_operator.manifests import Owner, desired_children
from flotilla_operator.pool_manifests import PoolOwner, build_pool_deployment
from flotilla_operator.render import RenderError, render
from flotilla_operator.server_args import PORT

from tests.support import inference_pool_schema
from tests.support.crd_schema import admit
from tests.support.examples import ROOT, crd_schema, load_example

IMAGE = types.DEFAULT_SERVER_IMAGE
TINY = ROOT / "examples" / "tiny-cpu.yaml"
SHARED_POOL = ROOT / "examples" / "pool" / "shared-pool.yaml"


def _model(**gateway: Any) -> dict[str, Any]:
    obj = load_example(TINY)
    if gateway:
        obj["spec"]["gateway"] = gateway
    return obj


def _render(*docs: dict[str, Any]) -> list[dict[str, Any]]:
    return render(yaml.safe_dump_all(docs), IMAGE, service_monitor=False)


def _one(children: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [c for c in children if c["kind"] == kind]
    return found


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_a_model_s_pods_carry_both_engine_type_labels_and_its_selector_is_unchanged():
    owner = Owner("tiny", "default", "uid-1", types.parse_spec(_model()["spec"]))
    deployment = _one(desired_children(owner, IMAGE, monitoring=False), "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[GIE_ENGINE_TYPE_LABEL] == "vllm" and pod_labels[LLMD_ENGINE_TYPE_LABEL] == "vllm"
    # the selector is immutable once the Deployment exists: the labels join the pods, never the selector
    assert GIE_ENGINE_TYPE_LABEL not in deployment["spec"]["selector"]["matchLabels"]
    assert GIE_ENGINE_TYPE_LABEL not in deployment["metadata"]["labels"]


def test_a_pool_s_pods_carry_both_engine_type_labels():
    pool_doc = next(d for d in yaml.safe_load_all(SHARED_POOL.read_text()) if d["kind"] == pool_types.KIND)
    owner = PoolOwner("shared", "default", "uid-2", pool_types.parse_pool_spec(pool_doc["spec"]))
    deployment = build_pool_deployment(owner, IMAGE)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[GIE_ENGINE_TYPE_LABEL] == "vllm" and pod_labels[LLMD_ENGINE_TYPE_LABEL] == "vllm"
    assert GIE_ENGINE_TYPE_LABEL not in deployment["spec"]["selector"]["matchLabels"]


def test_no_inference_pool_unless_the_spec_asks():
    assert "InferencePool" not in [c["kind"] for c in _render(_model())]
    assert "InferencePool" not in [c["kind"] for c in _render(_model(inferencePool=False))]


def test_the_rendered_inference_pool_is_valid_v1_and_selects_the_model_s_pods():
    children = _render(_model(inferencePool=True))
    pool = _one(children, "InferencePool")
    assert inference_pool_schema.validate(pool) == []
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["metadata"]["name"] == "tiny"
    deployment, service = _one(children, "Deployment"), _one(children, "Service")
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector == service["spec"]["selector"]  # the EPP and the Service see the same endpoints
    assert _matches(selector, deployment["spec"]["template"]["metadata"]["labels"])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert pool["spec"]["targetPorts"] == [{"number": container["ports"][0]["containerPort"]}] == [{"number": PORT}]
    assert pool["spec"]["endpointPickerRef"] == {"kind": "Service", "name": epp_service_name("tiny"),
                                                 "port": {"number": EPP_PORT}, "failureMode": "FailClose"}
    assert epp_service_name("tiny") == "tiny-epp" and EPP_PORT == 9002


def test_a_pooled_model_s_inference_pool_selects_its_pool_s_pods():
    docs = list(yaml.safe_load_all(SHARED_POOL.read_text()))
    member = next(d for d in docs if d["kind"] == types.KIND and d["spec"].get("pool") == "shared")
    member["spec"]["gateway"] = {"inferencePool": True}
    children = render(yaml.safe_dump_all(docs), IMAGE, service_monitor=False)
    (pool,) = [c for c in children if c["kind"] == "InferencePool"]
    assert inference_pool_schema.validate(pool) == [] and pool["metadata"]["name"] == member["metadata"]["name"]
    pool_deployment = next(c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"] == "shared-pool")
    assert _matches(pool["spec"]["selector"]["matchLabels"], pool_deployment["spec"]["template"]["metadata"]["labels"])


def test_render_on_the_command_line_prints_the_inference_pool_last():
    text = yaml.safe_dump(_model(inferencePool=True))
    result = subprocess.run([sys.executable, "-m", "flotilla_operator.cli", "render", "-f", "-"], input=text,
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert docs[-1]["kind"] == "InferencePool" and inference_pool_schema.validate(docs[-1]) == []
    assert "ownerReferences" not in docs[-1]["metadata"]  # no cluster, no uid, as for every rendered child


def _broken(path: str, value: Any) -> dict[str, Any]:
    pool = copy.deepcopy(_one(_render(_model(inferencePool=True)), "InferencePool"))
    *parents, last = path.split(".")
    node = pool
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return pool


SCHEMA_REFUSES = [  # the schema is not vacuous: each breaks one rule of the reference
    ("spec.endpointPickerRef.port", None, "port is required when kind is 'Service'"),
    ("spec.endpointPickerRef.failureMode", "FailSoft", "'FailSoft' is not one of ['FailOpen', 'FailClose']"),
    ("spec.targetPorts", [{"number": 8000}, {"number": 8001}], "is too long"),
    ("spec.targetPorts", [], "should be non-empty"),
    ("spec.targetPorts.0.number", 70000, "70000 is greater than the maximum of 65535"),
    ("spec.selector.matchLabels", {}, "should be non-empty"),
    ("spec.selector.matchLabels", {"app~x": "a"}, "does not match"),
    ("spec.selector.matchLabels", {"app": "-bad-"}, "does not match"),
    ("spec.selector", {"matchExpressions": []}, "'matchLabels' is a required property"),
    ("spec.endpointPickerRef.name", None, "'name' is a required property"),
    ("spec.endpointPickerRef.kind", "not/a-kind", "does not match"),
    ("spec.endpointPickerPort", 9002, "Additional properties are not allowed"),
    ("apiVersion", "inference.networking.x-k8s.io/v1alpha2", "was expected"),
]


@pytest.mark.parametrize(("path", "value", "message"), SCHEMA_REFUSES, ids=[f"{p}={v}" for p, v, _ in SCHEMA_REFUSES])
def test_the_schema_refuses_what_the_v1_reference_refuses(path, value, message):
    errors = inference_pool_schema.validate(_broken(path, value))
    assert any(message in error for error in errors), errors


def test_the_crd_defaults_the_field_off_and_refuses_a_non_boolean():
    stored, errors = admit(crd_schema(), _model())
    assert errors == [] and stored["spec"]["gateway"] == {"inferencePool": False}
    _, errors = admit(crd_schema(), _model(inferencePool="yes"))
    assert errors == ["spec.gateway.inferencePool: 'yes' is not of type 'boolean'"]


def test_render_refuses_a_non_boolean_and_says_where():
    with pytest.raises(RenderError, match=r"spec\.gateway\.inferencePool: Input should be a valid boolean"):
        _render(_model(inferencePool="yes"))
