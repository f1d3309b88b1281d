"""`spec.server.apiKeySecretRef`: model pods get the servers' API key from a Secret, never in the pod spec
(docs/gateway.md, "Keys between the gateway and the servers")."""

from __future__ import annotations

from typing import Any

import pytest
from flotilla_contract.flags import FLAGS_BY_NAME
from flotilla_operator import pool_types, types
from flotilla_operator.manifests import Owner, desired_children
from flotilla_operator.pool_manifests import PoolOwner, desired_pool_children
from flotilla_server.cli import parse_settings

from tests.support.crd_schema import admit
from tests.support.examples import ROOT, crd_schema, load_example

IMAGE = types.DEFAULT_SERVER_IMAGE
UID = "0d4b3c2a-1111-2222-3333-444455556666"
SECRET_VALUE = "sk-servers-0123456789"


def server_container(children: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(c for c in children if c["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def model_children(server: dict[str, Any]) -> list[dict[str, Any]]:
    spec = types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}, "server": server})
    return desired_children(Owner("m", "team-a", UID, spec), IMAGE, monitoring=False)


def as_the_kubelet_runs_it(container: dict[str, Any], secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment once the kubelet has read each secretKeyRef from `secrets`."""
    env = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secrets[(ref["name"], ref["key"])]
    return env


def test_the_example_pods_get_the_key_from_the_secret_and_the_server_then_requires_it():
    obj = load_example(ROOT / "examples" / "llama-3.1-8b-latency-first.yaml")
    spec = types.parse_spec(obj["spec"])
    container = server_container(desired_children(Owner(obj["metadata"]["name"], "default", UID, spec), IMAGE, False))
    variable = FLAGS_BY_NAME["--api-key"].env
    assert {"name": variable, "valueFrom": {"secretKeyRef": {"name": "flotilla-server-key", "key": "api-key"}}} \
        in container["env"]
    assert not any(arg.startswith("--api-key") for arg in container["args"])
    environ = as_the_kubelet_runs_it(container, {("flotilla-server-key", "api-key"): SECRET_VALUE})
    assert parse_settings(container["args"], environ=environ).api_key == SECRET_VALUE


def test_without_a_reference_the_pods_need_no_key():
    container = server_container(model_children({}))
    assert [e["name"] for e in container["env"]] == ["HOME", "HF_HOME"]
    assert parse_settings(container["args"], environ=as_the_kubelet_runs_it(container, {})).api_key is None


def test_the_secrets_entry_can_be_named():
    container = server_container(model_children({"apiKeySecretRef": {"name": "keys", "key": "llama"}}))
    environ = as_the_kubelet_runs_it(container, {("keys", "llama"): SECRET_VALUE})
    assert parse_settings(container["args"], environ=environ).api_key == SECRET_VALUE


def test_a_pools_servers_get_the_key_too():
    spec = pool_types.parse_pool_spec({"server": {"apiKeySecretRef": {"name": "pool-key"}}})
    container = server_container(desired_pool_children(PoolOwner("shared", "default", UID, spec), [], IMAGE))
    environ = as_the_kubelet_runs_it(container, {("pool-key", "api-key"): SECRET_VALUE})
    assert parse_settings(container["args"], environ=environ).api_key == SECRET_VALUE


@pytest.mark.parametrize(("ref", "admitted_ref", "error"), [
    ({"name": "flotilla-server-key"}, {"name": "flotilla-server-key", "key": "api-key"}, None),
    ({"name": "k", "key": "token"}, {"name": "k", "key": "token"}, None),
    ({"key": "api-key"}, None, "'name' is a required property"),
    ({"name": "Not_A_Name"}, None, "does not match"),
])
def test_the_crd_defaults_the_key_and_needs_a_secret_name(ref, admitted_ref, error):
    obj = {"apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": "m", "namespace": "d"},
           "spec": {"model": {"name": "m", "source": {"builtin": "tiny"}}, "server": {"apiKeySecretRef": ref}}}
    admitted, errors = admit(crd_schema(), obj)
    if error is None:
        assert errors == [] and admitted["spec"]["server"]["apiKeySecretRef"] == admitted_ref
    else:
        assert any(error in e for e in errors), errors
