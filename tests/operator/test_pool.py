"""ModelPool policy and builders (docs/pools.md): who joins, from where, and that membership restarts nothing."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml
from flotilla_operator import pool_types, types
from flotilla_operator.pool_manifests import (
    PoolOwner,
    desired_pool_children,
    pool_server_args,
)
from flotilla_operator.pool_members import (
    NOT_LISTABLE,
    SOURCE_NOT_POOLABLE,
    Member,
    joins_pool,
    member_source,
    members,
    members_file,
)
from flotilla_operator.server_args import server_dtype
from flotilla_operator.status import Problem
from flotilla_server.cli import parse_settings
from flotilla_server.model_cache.specs import parse_list
from hypothesis import given
from hypothesis import strategies as st

from tests.support.examples import ROOT

EXAMPLE = ROOT / "examples" / "pool" / "shared-pool.yaml"
POOL = pool_types.parse_pool_spec({"volume": {"claimName": "models"}, "memoryBudget": "1Gi"})
IMAGE = types.DEFAULT_SERVER_IMAGE


def model(source: dict[str, Any], policy: str = "cost-first", pool: str | None = "shared", name: str = "m",
          quantization: str | None = None):
    spec: dict[str, Any] = {"model": {"name": name, "source": source}, "placement": {"policy": policy},
                            "scaling": {"minReplicas": 0 if policy == "cost-first" else 1}}
    if quantization is not None:
        spec["server"] = {"quantization": quantization}
    if pool is not None:
        spec["pool"] = pool
    return types.parse_spec(spec)


@pytest.mark.parametrize(("source", "loads_from"), [
    ({"builtin": "tiny"}, "tiny"),
    ({"pvc": {"claimName": "models"}}, "/models"),
    ({"pvc": {"claimName": "models", "path": "/llama/8b/"}}, "/models/llama/8b"),
])
def test_poolable_sources_load_from_the_pool_pods_as_they_are(source, loads_from):
    assert member_source(model(source), POOL) == loads_from


@pytest.mark.parametrize(("source", "pool", "says"), [
    ({"huggingface": {"repo": "org/name"}}, POOL, "copy the model's files into PersistentVolumeClaim 'models'"),
    ({"image": {"reference": "registry/model:1"}}, POOL, "set spec.model.source to pvc: {claimName: models"),
    ({"pvc": {"claimName": "other"}}, POOL, "claim 'other' is not the pool's volume"),
    ({"huggingface": {"repo": "org/name"}}, pool_types.parse_pool_spec({}), "give ModelPool shared a spec.volume.claimName"),
])
def test_other_sources_are_not_poolable_and_the_message_says_how_to_fix_it(source, pool, says):
    problem = member_source(model(source), pool)
    assert isinstance(problem, Problem) and problem.reason == SOURCE_NOT_POOLABLE
    assert says in problem.message and "or remove spec.pool" in problem.message


@pytest.mark.parametrize(("policy", "pool", "joins"), [
    ("cost-first", "shared", True),
    ("latency-first", "shared", False),  # the hot tier keeps its own Deployment
    ("cost-first", None, False),
])
def test_only_cost_first_models_naming_a_pool_join_it(policy, pool, joins):
    assert joins_pool(model({"builtin": "tiny"}, policy, pool)) is joins


def test_members_are_the_joining_models_of_this_pool_that_it_can_load():
    models = [
        ("a", model({"builtin": "tiny"}, name="alpha")),
        ("b", model({"pvc": {"claimName": "models", "path": "b"}}, name="beta")),
        ("c", model({"huggingface": {"repo": "o/n"}}, name="gamma")),  # not poolable
        ("d", model({"builtin": "tiny"}, "latency-first", name="delta")),  # dedicated
        ("e", model({"builtin": "tiny"}, pool="other", name="epsilon")),  # another pool
    ]
    assert members(models, "shared", POOL) == [Member("a", "alpha", "tiny"), Member("b", "beta", "/models/b")]


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from(["tiny", "/models/x"])), max_size=8))
def test_the_members_file_has_one_sorted_line_per_served_name(entries):
    found = [Member(f"im-{i}", name, source) for i, (name, source) in enumerate(entries)]
    lines = members_file(found).splitlines()
    names = [line.split("=", 1)[0] for line in lines]
    assert names == sorted(set(name for name, _ in entries))
    for line in lines:  # the first member of a name wins
        name, source = line.split("=", 1)
        assert source == next(s for n, s in entries if n == name)


@pytest.mark.parametrize(("name", "source", "says"), [
    ("my model", {"builtin": "tiny"}, "model name 'my model' must start with a letter or digit"),
    ("a=b", {"builtin": "tiny"}, "model name 'a=b'"),
    ("a\n", {"builtin": "tiny"}, "model name 'a\\n' must start"),  # a final newline: a second line
    ("m", {"pvc": {"claimName": "models", "path": "my model"}}, "'model' follows source '/models/my'"),
    ("m", {"pvc": {"claimName": "models", "path": "x\nevil=/etc"}}, "holds a control character"),
    ("m", {"pvc": {"claimName": "models", "path": "x "}}, "source '/models/x ' begins or ends with whitespace"),
])
def test_a_member_whose_line_the_servers_would_refuse_is_not_listed_and_says_why(name, source, says):
    spec = model(source, name=name)
    problem = member_source(spec, POOL)
    assert isinstance(problem, Problem) and problem.reason == NOT_LISTABLE
    assert says in problem.message and "rename spec.model.name or the model's path" in problem.message
    assert members([("im", spec)], "shared", POOL) == []  # never written: one member cannot spoil the file


_NAMES = st.text(st.sampled_from("aZ09._:/-= \t#\n\x00é"), min_size=1, max_size=12)
_PATHS = st.text(st.sampled_from("ab/._- \t\n=#é"), max_size=12)


@given(st.lists(st.tuples(_NAMES, st.none() | _PATHS), max_size=6))
def test_the_members_file_round_trips_through_the_servers_strict_parser(entries):
    """Whatever names and paths InferenceModels carry, the file the operator writes is one the servers accept,
    and it lists exactly the members it holds: each served name once, from the first InferenceModel."""
    models = [(f"im-{i}", model({"builtin": "tiny"} if path is None else {"pvc": {"claimName": "models", "path": path}},
                                name=name)) for i, (name, path) in enumerate(entries)]
    found = members(models, "shared", POOL)
    assert {m.name for m in found} == {n for n, spec in models if isinstance(member_source(spec, POOL), str)}
    first = {}
    for m in sorted(found, key=lambda m: m.name):
        first.setdefault(m.model, m.source)
    assert {s.name: s.source for s in parse_list(members_file(found), "models")} == first


def test_each_member_line_carries_its_models_quantization_so_a_pool_may_mix_them():
    models = [("a", model({"pvc": {"claimName": "models", "path": "a.Q4_1.gguf"}}, name="alpha")),
              ("b", model({"pvc": {"claimName": "models", "path": "b.Q4_1.gguf"}}, name="beta", quantization="none"))]
    text = members_file(members(models, "shared", POOL))
    assert text == "alpha=/models/a.Q4_1.gguf\nbeta=/models/b.Q4_1.gguf quantization=none\n"
    assert [(s.name, s.quantization) for s in parse_list(text, "models")] == [("alpha", None), ("beta", "none")]


def owner(spec: pool_types.ModelPoolSpec = POOL) -> PoolOwner:
    return PoolOwner("shared", "default", "0d4b3c2a-1111-2222-3333-444455556666", spec)


def by_kind(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {child["kind"]: child for child in children}


@given(st.lists(st.sampled_from([Member("a", "alpha", "tiny"), Member("b", "beta", "/models/b"),
                                 Member("c", "gamma", "/models/c")]), unique=True))
def test_membership_changes_the_configmap_and_never_the_pod_template(found):
    empty, with_members = by_kind(desired_pool_children(owner(), [], IMAGE)), by_kind(desired_pool_children(owner(), found, IMAGE))
    assert with_members["Deployment"] == empty["Deployment"]  # no restart: the template never names a member
    assert "annotations" not in with_members["Deployment"]["spec"]["template"]["metadata"]
    assert with_members["ConfigMap"]["data"]["models"] == members_file(found)


def test_the_members_file_is_mounted_as_a_directory_so_the_kubelet_updates_it():
    deployment = by_kind(desired_pool_children(owner(), [], IMAGE))["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "members")
    assert "subPath" not in mount  # a subPath mount is never updated in place
    args = container["args"]
    assert args[args.index("--model-list-file") + 1] == f"{mount['mountPath']}/models"
    assert args[args.index("--memory-budget") + 1] == str(1024**3)
    assert args[args.index("--unreadable-model-at-start") + 1] == "skip"  # one member's files never stop the others
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]


@pytest.mark.parametrize(("policy", "pdb"), [("cost-first", False), ("latency-first", True)])
def test_the_pool_carries_the_pdb_policy(policy, pdb):
    spec = pool_types.parse_pool_spec({"placement": {"policy": policy}, "scaling": {"minReplicas": 1}})
    assert ("PodDisruptionBudget" in by_kind(desired_pool_children(owner(spec), [], IMAGE))) is pdb


def example_documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc]


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_the_example_pools_children_pass_kubernetes_validate_strict(version):
    (pool,) = [d for d in example_documents() if d["kind"] == "ModelPool"]
    models = [(d["metadata"]["name"], types.parse_spec(d["spec"])) for d in example_documents() if d["kind"] == "InferenceModel"]
    spec = pool_types.parse_pool_spec(pool["spec"])
    found = members(models, "shared", spec)
    assert [m.name for m in found] == ["summarizer", "support-bot"]
    for child in desired_pool_children(owner(spec), found, IMAGE):
        kubernetes_validate.validate(copy.deepcopy(child), version, strict=True)


def test_the_pool_servers_flags_parse_with_the_servers_own_parser_in_multi_model_mode():
    settings = parse_settings(pool_server_args(POOL), environ={})  # exits on an unknown flag
    assert (settings.max_num_seqs, settings.port) == (POOL.server.max_num_seqs, 8000)
    assert settings.model_list_file == "/etc/flotilla/pool/models"
    assert settings.memory_budget_bytes == 1024**3


@pytest.mark.parametrize(("server", "resources", "dtype"), [
    ({}, {}, "auto"),  # CPU, unset: the server picks per member and CPU (model/dtype_choice.py)
    ({"dtype": "float32"}, {}, "float32"),
    ({}, {"gpus": 1}, "bfloat16"),
])
def test_pool_and_model_pods_get_the_same_dtype_rule(server, resources, dtype):
    pool = pool_types.parse_pool_spec({"volume": {"claimName": "models"}, "memoryBudget": "1Gi", "server": server,
                                       "resources": resources})
    args = pool_server_args(pool)
    assert args[args.index("--dtype") + 1] == dtype
    dedicated = types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}, "server": server,
                                  "resources": resources})
    assert server_dtype(dedicated.server, dedicated.resources.gpus) == dtype
    if not resources:
        assert parse_settings(args, environ={}).dtype == dtype  # the server takes it


def test_pool_servers_get_the_classes_of_spec_server():
    spec = pool_types.parse_pool_spec({"volume": {"claimName": "models"}, "memoryBudget": "1Gi",
                                       "server": {"classes": {"weights": {"batch": 3}, "tenantMaxQueued": 16}}})
    args = pool_server_args(spec)
    assert args[args.index("--class-weights") + 1] == "interactive=8,batch=3"
    settings = parse_settings(args, environ={})  # the multi-model server takes them (exits on a refused flag)
    assert (settings.class_weights, settings.tenant_max_queued) == ("interactive=8,batch=3", 16)
    assert "--class-weights" not in pool_server_args(POOL)  # defaults: nothing rendered


def test_render_prints_the_pool_its_members_services_and_the_dedicated_model():
    from tests.operator.test_render import run_cli

    result = run_cli("render", "-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Service", "shared-pool"), ("ConfigMap", "shared-pool-members"), ("Deployment", "shared-pool"),
        ("Service", "support-bot"), ("Service", "summarizer"),  # members: a Service, no Deployment
        ("Service", "chat"), ("Deployment", "chat"), ("PodDisruptionBudget", "chat"),  # latency-first: dedicated
    ]
    assert docs[1]["data"]["models"] == "summarizer=/models/summarizer\nsupport-bot=tiny\n"
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_render_refuses_a_pooled_model_without_its_pool_and_says_what_to_do():
    from tests.operator.test_render import run_cli

    member = next(d for d in example_documents() if d["metadata"]["name"] == "support-bot")
    result = run_cli("render", "-f", "-", stdin=yaml.safe_dump(member))
    assert result.returncode == 2
    assert "render the pool and its members together" in result.stderr


@pytest.mark.parametrize(("spec", "message"), [
    ({"resources": {"gpus": 1}}, "a GPU pool needs memoryBudget or resources.gpuMemory"),
    ({"resources": {"gpus": 1, "gpuMemory": "80Gi"}}, None),
    ({"resources": {"gpus": 1}, "memoryBudget": "60Gi"}, None),
    ({"server": {"kvCacheMemoryFraction": 0.5}}, "server.kvCacheMemoryFraction does not apply to a pool"),
    ({"scaling": {"minReplicas": 3, "maxReplicas": 2}}, "scaling.minReplicas must not exceed scaling.maxReplicas"),
    ({}, None),
])
def test_the_pool_crd_refuses_what_cannot_be_served_and_says_what_to_change(spec, message):
    from tests.support.crd_schema import admit
    from tests.support.examples import pool_crd

    schema = pool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelPool", "metadata": {"name": "p"}, "spec": spec}
    admitted, errors = admit(schema, obj)
    if message is None:
        assert errors == [] and admitted["spec"]["placement"]["policy"] == "cost-first"  # the pool's default
    else:
        assert any(message in error for error in errors), errors
