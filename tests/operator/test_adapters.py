"""spec.adapters: the CRD's refusals, a dedicated model's list file, volumes and init containers, a pool's
member lines and claims, and status.adapters / AdapterRefused from the servers' load reports."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kubernetes_validate
import pydantic
import pytest
from flotilla_contract.load import AdapterRefused, AdapterServed, ServerLoad
from flotilla_contract.model_list import parse_model_list
from flotilla_operator import adapter_status, pool_types, reconciler, types
from flotilla_operator.adapter_status import PodAdapters, adapter_counts, pod_adapters, refused_problem
from flotilla_operator.adapters import LIST_FILE, claim_volume_name
from flotilla_operator.manifests import Owner, desired_children
from flotilla_operator.pool_manifests import PoolOwner, desired_pool_children
from flotilla_operator.pool_members import SOURCE_NOT_POOLABLE, member_source, members, members_file
from flotilla_server.engine.lora_list import parse_lora_list

from tests.support.crd_schema import admit
from tests.support.examples import ROOT, crd_schema, load_example

IMAGE = types.DEFAULT_SERVER_IMAGE
UID = "0d4b3c2a-1111-2222-3333-444455556666"
VERSIONS = ("1.30.0", "1.37.0")


def pvc(name: str, claim: str, path: str = "") -> dict[str, Any]:
    return {"name": name, "source": {"pvc": {"claimName": claim, "path": path}}}


def image(name: str, reference: str = "registry.example.com/a:1", path: str = "/adapter") -> dict[str, Any]:
    return {"name": name, "source": {"image": {"reference": reference, "path": path}}}


def spec_with(adapters: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": {"name": "base", "source": {"builtin": "tiny"}}, "adapters": adapters, **extra}


def owner(spec: dict[str, Any], name: str = "m") -> Owner:
    return Owner(name, "default", UID, types.parse_spec(spec))


def kids(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {child["kind"]: child for child in desired_children(owner(spec), IMAGE, monitoring=False)}


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def validate_strict(*children: dict[str, Any]) -> None:
    for child in children:
        for version in VERSIONS:
            kubernetes_validate.validate(child, version, strict=True)


# --- the CRD -------------------------------------------------------------------------------------------------

def _object(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": "m", "namespace": "default"},
            "spec": spec}


REFUSED = [
    ("huggingface source", [{"name": "a", "source": {"huggingface": {"repo": "o/r"}}}],
     "spec.adapters[0].source: " + types.ADAPTER_HUGGINGFACE_REFUSED),
    ("no source", [{"name": "a", "source": {}}], "spec.adapters[0].source: adapters[].source must set exactly one of pvc or image"),
    ("two sources", [{"name": "a", "source": {**pvc("a", "c")["source"], **image("a")["source"]}}],
     "spec.adapters[0].source: adapters[].source must set exactly one of pvc or image"),
    ("the model's name", [pvc("base", "c")],
     "spec: adapters[].name must differ from model.name: a request names an adapter as its model"),
    ("a name twice", [pvc("a", "c", "x"), image("a")], "spec: adapters[].name must be unique within the model"),
    ("not a DNS label", [pvc("Legal_v2", "c")], "spec.adapters[0].name: 'Legal_v2' does not match"),
    ("a path escaping the volume", [pvc("a", "c", "../x")], "spec.adapters[0].source.pvc.path: '../x' does not match"),
    ("a relative image path", [image("a", path="adapter")], "spec.adapters[0].source.image.path: 'adapter' does not match"),
    ("too many", [pvc(f"a{i}", "c", f"a{i}") for i in range(types.MAX_ADAPTERS + 1)], "spec.adapters: "),
]


@pytest.mark.parametrize(("case", "adapters", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_the_crd_refuses_bad_adapters_naming_the_field(case, adapters, message):
    _, errors = admit(crd_schema(), _object(spec_with(adapters)))
    assert any(error.startswith(message) for error in errors), errors
    with pytest.raises(pydantic.ValidationError):  # the operator's own reading refuses them too
        types.parse_spec(spec_with(adapters))


def test_the_crd_admits_adapters_and_defaults_their_paths():
    stored, errors = admit(crd_schema(), _object(spec_with([pvc("a", "c"), {"name": "b", "source": {"image": {
        "reference": "r:1"}}}], server={"maxLoras": 8, "maxLoraRank": 64})))
    assert errors == []
    assert stored["spec"]["adapters"][0]["source"]["pvc"]["path"] == ""
    assert stored["spec"]["adapters"][1]["source"]["image"]["path"] == "/adapter"
    assert types.parse_spec(stored["spec"]).server.max_loras == 8


@pytest.mark.parametrize("server", [{"maxLoras": 0}, {"maxLoraRank": 65}])
def test_adapter_slots_are_bounded(server):
    _, errors = admit(crd_schema(), _object(spec_with([], server=server)))
    assert errors and errors[0].startswith("spec.server.maxLora")


# --- a dedicated model ---------------------------------------------------------------------------------------

def test_no_adapters_render_no_list_file_and_no_adapter_flag():
    children = kids(spec_with([]))
    assert "ConfigMap" not in children
    args = pod(children["Deployment"])["containers"][0]["args"]
    assert "--lora-list-file" not in args and "--max-loras" not in args


def test_adapters_render_a_list_file_claims_once_and_an_init_container_per_image():
    spec = spec_with([pvc("support", "adapters", "support"), pvc("legal", "adapters", "legal/v2"),
                      pvc("sql", "other-claim"), image("tone", "registry.example.com/tone:3", "/peft/tone")],
                     server={"maxLoras": 8, "maxLoraRank": 32})
    children = kids(spec)
    configmap, deployment = children["ConfigMap"], children["Deployment"]
    validate_strict(configmap, deployment)
    assert configmap["metadata"]["name"] == "m-adapters"
    text = configmap["data"]["adapters"]
    assert text.splitlines() == ["support=/adapters/pvc/adapters/support", "legal=/adapters/pvc/adapters/legal/v2",
                                 "sql=/adapters/pvc/other-claim", "tone=/adapters/image/tone"]
    assert parse_lora_list(text, "list").entries == {  # the server's own reading of the file
        "support": "/adapters/pvc/adapters/support", "legal": "/adapters/pvc/adapters/legal/v2",
        "sql": "/adapters/pvc/other-claim", "tone": "/adapters/image/tone"}
    spec_ = pod(deployment)
    server = spec_["containers"][0]
    args = server["args"]
    assert args[args.index("--lora-list-file") + 1] == LIST_FILE
    assert args[args.index("--max-loras") + 1] == "8" and args[args.index("--max-lora-rank") + 1] == "32"
    claims = [v for v in spec_["volumes"] if "persistentVolumeClaim" in v]
    assert [v["persistentVolumeClaim"] for v in claims] == [
        {"claimName": "adapters", "readOnly": True}, {"claimName": "other-claim", "readOnly": True}]
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    assert mounts[claim_volume_name("adapters")] == {
        "name": claim_volume_name("adapters"), "mountPath": "/adapters/pvc/adapters", "readOnly": True}
    # the list file's ConfigMap is mounted as a directory (no subPath), so the kubelet updates it in place
    assert mounts["adapter-list"] == {"name": "adapter-list", "mountPath": "/etc/flotilla/adapters", "readOnly": True}
    assert {"name": "adapter-list", "configMap": {"name": "m-adapters"}} in spec_["volumes"]
    (init,) = spec_["initContainers"]
    assert init["image"] == "registry.example.com/tone:3"
    assert init["command"] == ["cp", "-R", "/peft/tone", "/adapters/image/tone"]
    assert init["volumeMounts"] == [{"name": "adapter-images", "mountPath": "/adapters/image"}]


def test_the_server_parses_the_rendered_flags():
    from flotilla_server.cli import parse_settings

    deployment = kids(spec_with([pvc("a", "c")], server={"maxLoras": 2}))["Deployment"]
    settings = parse_settings(pod(deployment)["containers"][0]["args"], environ={})
    assert settings.lora_list_file == LIST_FILE and settings.max_loras == 2


def test_an_image_model_and_image_adapters_keep_both_init_containers():
    spec = spec_with([image("a")])
    spec["model"]["source"] = {"image": {"reference": "registry.example.com/model:1"}}
    names = [c["name"] for c in pod(kids(spec)["Deployment"])["initContainers"]]
    assert names == ["copy-model", "copy-adapter-0"]


def test_a_pvc_adapter_on_a_mounted_claim_changes_the_list_file_only():
    """Adding or removing such an adapter restarts no pod: the pod template stays exactly as it was."""
    before = kids(spec_with([pvc("a", "c", "a")]))
    after = kids(spec_with([pvc("a", "c", "a"), pvc("b", "c", "b")]))
    assert after["Deployment"] == before["Deployment"]
    assert after["ConfigMap"]["data"] != before["ConfigMap"]["data"]


@pytest.mark.parametrize("added", [pvc("b", "new-claim"), image("b")], ids=["new claim", "image"])
def test_a_new_claim_or_an_image_adapter_changes_the_pod_template(added):
    before = kids(spec_with([pvc("a", "c", "a")]))["Deployment"]
    after = kids(spec_with([pvc("a", "c", "a"), added]))["Deployment"]
    assert after["spec"]["template"] != before["spec"]["template"]


def test_the_example_with_adapters_renders_valid_children():
    obj = load_example(ROOT / "examples" / "llama-3.2-3b-adapters.yaml")
    stored, errors = admit(crd_schema(), obj)
    assert errors == []
    children = desired_children(Owner("x", "default", UID, types.parse_spec(stored["spec"])), IMAGE, monitoring=False)
    validate_strict(*(c for c in children if c["kind"] != "ServiceMonitor"))
    assert any(c["kind"] == "ConfigMap" for c in children)


# --- a pool --------------------------------------------------------------------------------------------------

def pool_spec(**extra: Any) -> pool_types.ModelPoolSpec:
    return pool_types.parse_pool_spec({"volume": {"claimName": "pool-models"}, **extra})


def member_spec(name: str, adapters: list[dict[str, Any]], source: dict[str, Any] | None = None) -> types.InferenceModelSpec:
    return types.parse_spec({"model": {"name": name, "source": source or {"builtin": "tiny"}}, "adapters": adapters,
                             "pool": "p", "placement": {"policy": "cost-first"}, "scaling": {"minReplicas": 0}})


def test_a_members_adapters_become_base_lines_and_their_claims_are_mounted():
    found = members([
        ("llama", member_spec("llama", [pvc("legal", "pool-models", "adapters/legal"), pvc("sql", "lora")])),
        ("qwen", member_spec("qwen", [pvc("support", "lora", "support")],
                             {"pvc": {"claimName": "pool-models", "path": "qwen"}})),
    ], "p", pool_spec())
    text = members_file(found)
    assert text.splitlines() == ["llama=tiny", "qwen=/models/qwen", "legal=/models/adapters/legal base=llama",
                                 "sql=/adapters/pvc/lora base=llama", "support=/adapters/pvc/lora/support base=qwen"]
    assert [e.base for e in parse_model_list(text, "members")] == [None, None, "llama", "llama", "qwen"]
    children = {c["kind"]: c for c in desired_pool_children(PoolOwner("p", "default", UID, pool_spec()), found, IMAGE)}
    validate_strict(children["Deployment"], children["ConfigMap"])
    volumes = pod(children["Deployment"])["volumes"]
    # the pool's own volume once, the other adapter claim once, whatever the number of adapters on it
    assert [v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v] == [
        "pool-models", "lora"]


def test_a_pool_without_adapter_claims_keeps_its_pod_template():
    plain = desired_pool_children(PoolOwner("p", "default", UID, pool_spec()), [], IMAGE)
    on_volume = members([("m", member_spec("m", [pvc("a", "pool-models", "a")]))], "p", pool_spec())
    with_adapter = desired_pool_children(PoolOwner("p", "default", UID, pool_spec()), on_volume, IMAGE)
    assert [c for c in plain if c["kind"] == "Deployment"] == [c for c in with_adapter if c["kind"] == "Deployment"]


def test_an_image_adapter_keeps_a_model_out_of_a_pool_saying_why():
    spec = member_spec("m", [image("a")])
    problem = member_source(spec, pool_spec())
    assert problem.reason == SOURCE_NOT_POOLABLE and "adapter 'a'" in problem.message
    assert members([("m", spec)], "p", pool_spec()) == []


def test_an_adapter_named_like_another_member_is_left_out_of_the_file():
    found = members([("a", member_spec("alpha", [pvc("beta", "lora")])), ("b", member_spec("beta", [pvc("x", "lora")])),
                     ("c", member_spec("gamma", [pvc("x", "lora", "y")]))], "p", pool_spec())
    lines = members_file(found).splitlines()
    assert lines == ["alpha=tiny", "beta=tiny", "gamma=tiny", "x=/adapters/pvc/lora base=beta"]


def test_pool_server_args_carry_the_adapter_slots():
    spec = pool_spec(server={"maxLoras": 3, "maxLoraRank": 8})
    deployment = next(c for c in desired_pool_children(PoolOwner("p", "default", UID, spec), [], IMAGE)
                      if c["kind"] == "Deployment")
    args = pod(deployment)["containers"][0]["args"]
    assert args[args.index("--max-loras") + 1] == "3" and args[args.index("--max-lora-rank") + 1] == "8"


# --- status ----------------------------------------------------------------------------------------------------

def report(ready: bool = True, served: tuple[str, ...] = (), resident: tuple[str, ...] = (),
           refused: tuple[tuple[str, str], ...] = ()) -> ServerLoad:
    return ServerLoad(ready=ready, waiting=0, running=0, slots=4, queue_capacity=32, kv_usage=0.0,
                      adapters=[AdapterServed(name=n, base="base") for n in served], adapters_resident=list(resident),
                      adapters_refused=[AdapterRefused(name=n, error=e) for n, e in refused])


def test_pod_adapters_reads_the_load_report():
    got = pod_adapters(report(served=("a", "b"), resident=("a",), refused=(("c", "rank 64 over 16"),)))
    assert got == PodAdapters(True, frozenset({"a", "b"}), frozenset({"a"}), (("c", "rank 64 over 16"),))


COUNTS = [
    ("no pods", {}, [("a", 0, 0)]),
    ("one pod serving, resident", {"p1": PodAdapters(True, frozenset({"a"}), frozenset({"a"}))}, [("a", 1, 1)]),
    ("a pod without a report counts nothing", {"p1": PodAdapters(True, frozenset({"a"})), "p2": None}, [("a", 1, 0)]),
    ("a pod not ready counts nothing", {"p1": PodAdapters(False, frozenset({"a"}), frozenset({"a"}))}, [("a", 0, 0)]),
    ("two pods, one adapter each", {"p1": PodAdapters(True, frozenset({"a"})), "p2": PodAdapters(True, frozenset({"a", "b"}))},
     [("a", 2, 0), ("b", 1, 0)]),
]


@pytest.mark.parametrize(("case", "pods", "expected"), COUNTS, ids=[c[0] for c in COUNTS])
def test_adapter_counts(case, pods, expected):
    names = [name for name, _, _ in expected]
    assert adapter_counts(names, pods) == [{"name": n, "pods": p, "resident": r} for n, p, r in expected]


def test_no_refusal_no_problem():
    assert refused_problem(["a"], "base", {"p1": PodAdapters(True, frozenset({"a"}))}) is None
    # a refusal of an adapter that is not this model's (another pool member's) is not this model's problem
    assert refused_problem(["a"], "base", {"p1": PodAdapters(True, refused=(("z", "bad"),))}) is None


def test_a_refused_adapter_names_the_adapter_the_model_and_the_servers_reason():
    pods = {"p2": PodAdapters(True, refused=(("legal", "hidden size 4096 is not the base's 2048"),)),
            "p1": PodAdapters(True, refused=(("legal", "hidden size 4096 is not the base's 2048"),)),
            "p3": PodAdapters(True, frozenset({"legal"})), "p4": None}
    problem = refused_problem(["support", "legal"], "llama", pods)
    assert problem.reason == adapter_status.ADAPTER_REFUSED
    assert problem.message.startswith("adapter 'legal' of model 'llama' is refused by 2/3 pods (p1): hidden size 4096 "
                                      "is not the base's 2048; fix the adapter")


# --- status through the reconciler's writer (a fake API: one object, its pods, their reports) ---------------------

class FakeKube:
    def __init__(self, obj: dict[str, Any], pods: list[dict[str, Any]]):
        self.obj, self.pods = obj, pods

    async def get(self, api_version, plural, namespace, name):
        if plural == types.PLURAL:
            return copy.deepcopy(self.obj)
        if plural == "deployments":
            return {"metadata": {"generation": 1}, "status": {"observedGeneration": 1, "replicas": len(self.pods),
                                                              "readyReplicas": len(self.pods),
                                                              "updatedReplicas": len(self.pods)}}
        return None

    async def list(self, api_version, plural, namespace, selector):
        return self.pods if plural == "pods" else []

    async def patch(self, api_version, plural, namespace, name, patch, subresource=None):
        self.obj["status"] = {**(self.obj.get("status") or {}), **patch["status"]}

    async def create(self, *args, **kwargs):  # Events
        return {}


def test_status_adapters_and_degraded_on_a_refused_adapter(monkeypatch):
    spec = spec_with([pvc("legal", "c"), pvc("support", "c")])
    obj = {"metadata": {"name": "m", "namespace": "default", "uid": UID, "generation": 1, "resourceVersion": "1"},
           "spec": spec, "status": {}}
    pods = [{"metadata": {"name": f"m-{i}"}, "status": {"phase": "Running", "podIP": f"10.0.0.{i}"}} for i in (1, 2)]
    reports = {"m-1": report(served=("support",), resident=("support",),
                             refused=(("legal", "--lora-list-file's adapter 'legal': rank 64 is over --max-lora-rank 16"),)),
               "m-2": report(served=("support", "legal"))}

    async def read_loads(asked):
        assert [p["metadata"]["name"] for p in asked] == ["m-1", "m-2"]
        return reports

    monkeypatch.setattr(reconciler, "read_loads", read_loads)
    kube = FakeKube(obj, pods)
    ctx = reconciler.Context(settings=None, kube=kube, monitoring=False)  # type: ignore[arg-type]
    asyncio.run(reconciler.write_status(ctx, "default", "m", problems=[], applied_generation=1))
    status = kube.obj["status"]
    assert status["adapters"] == [{"name": "legal", "pods": 1, "resident": 0}, {"name": "support", "pods": 2, "resident": 1}]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "AdapterRefused"
    assert "adapter 'legal' of model 'base' is refused by 1/2 pods (m-1): --lora-list-file's adapter 'legal': rank 64" \
        in degraded["message"]
    assert status["phase"] == "Degraded"

    reports["m-1"] = report(served=("support", "legal"))  # the adapter fixed: recomputed, not carried
    asyncio.run(reconciler.write_status(ctx, "default", "m", problems=None))
    status = kube.obj["status"]
    assert next(c for c in status["conditions"] if c["type"] == "Degraded")["status"] == "False"
    assert status["adapters"][0] == {"name": "legal", "pods": 2, "resident": 0}
