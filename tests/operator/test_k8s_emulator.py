"""The test API server behaves as Kubernetes does where the operator depends on it."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.examples import crd
from tests.support.k8s_emulator import ApiError, serve
from tests.support.k8s_semantics import json_patch, labels_match, merge_patch

IM = ("flotilla.dev/v1alpha1", "inferencemodels")


def model(name: str = "m") -> dict:
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceModel",
            "metadata": {"name": name, "namespace": "default", "labels": {"tier": "a"}},
            "spec": {"model": {"name": name, "source": {"builtin": "tiny"}}}}


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("emulator"), crds=[crd()]) as handle:
        yield handle


def test_metadata_is_filled_in_and_generation_follows_the_spec_only(k8s):
    created = k8s.create(model("gen"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    rv = int(meta["resourceVersion"])
    labelled = k8s.patch(*IM, "gen", "default", {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 1 and int(labelled["metadata"]["resourceVersion"]) > rv
    specced = k8s.patch(*IM, "gen", "default", {"spec": {"replicas": 2}})
    assert specced["metadata"]["generation"] == 2
    same = k8s.patch(*IM, "gen", "default", {"spec": {"replicas": 2}})
    assert same["metadata"]["resourceVersion"] == specced["metadata"]["resourceVersion"]  # no-op writes nothing


def test_status_subresource_separates_status_from_spec(k8s):
    k8s.create(model("sub"))
    main = k8s.patch(*IM, "sub", "default", {"status": {"phase": "Ready"}})
    assert "status" not in main  # ignored on the main resource
    status = k8s.patch(*IM, "sub", "default", {"status": {"phase": "Ready"}, "spec": {"replicas": 3}}, subresource="status")
    assert status["status"] == {"phase": "Ready"} and status["spec"]["replicas"] == 1 and status["metadata"]["generation"] == 1


def test_scale_subresource_reads_and_writes_spec_replicas(k8s):
    k8s.create(model("scale"))
    k8s.patch(*IM, "scale", "default", {"status": {"replicas": 1, "selector": "a=b"}}, subresource="status")
    scale = k8s.get(*IM, "scale", "default", "scale")
    assert scale["kind"] == "Scale" and scale["spec"] == {"replicas": 1}
    assert scale["status"] == {"replicas": 1, "selector": "a=b"}
    k8s.patch(*IM, "scale", "default", {"spec": {"replicas": 3}}, subresource="scale")
    assert k8s.get(*IM, "scale", "default")["spec"]["replicas"] == 3


def test_crd_defaults_and_validation_apply_on_writes(k8s):
    created = k8s.create(model("defaults"))
    assert created["spec"]["server"]["blockSize"] == 16
    bad = model("bad")
    bad["spec"]["scaling"] = {"minReplicas": 3, "maxReplicas": 2}
    with pytest.raises(ApiError) as rejected:
        k8s.create(bad)
    assert rejected.value.code == 422
    assert "scaling.minReplicas must not exceed scaling.maxReplicas" in json.loads(rejected.value.message)["message"]
    with pytest.raises(ApiError):
        k8s.patch(*IM, "defaults", "default", {"spec": {"server": {"blockSize": 3}}})


def test_conflicts_on_stale_resource_version_and_duplicates(k8s):
    created = k8s.create(model("conflict"))
    k8s.patch(*IM, "conflict", "default", {"spec": {"replicas": 2}})
    with pytest.raises(ApiError) as stale:
        k8s.patch(*IM, "conflict", "default", {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
                                               "spec": {"replicas": 3}})
    assert stale.value.code == 409
    with pytest.raises(ApiError) as duplicate:
        k8s.create(model("conflict"))
    assert duplicate.value.code == 409


def test_lists_have_kinds_and_honour_label_selectors(k8s):
    k8s.create({**model("listed"), "metadata": {"name": "listed", "namespace": "default", "labels": {"tier": "b"}}})
    listing = k8s.request("GET", "/apis/flotilla.dev/v1alpha1/namespaces/default/inferencemodels")
    assert listing["kind"] == "InferenceModelList" and listing["metadata"]["resourceVersion"]
    assert [o["metadata"]["name"] for o in k8s.list(*IM, "default", labels="tier=b")] == ["listed"]


def test_finalizers_hold_deletion_and_owner_references_cascade(k8s):
    owner = k8s.create({**model("owner"), "metadata": {"name": "owner", "namespace": "default", "finalizers": ["x/y"]}})
    ref = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceModel", "name": "owner",
           "uid": owner["metadata"]["uid"], "controller": True}
    k8s.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "owned", "namespace": "default",
                                                                    "ownerReferences": [ref]}, "spec": {}})
    k8s.delete(*IM, "owner", "default")
    held = k8s.get(*IM, "owner", "default")
    assert held["metadata"]["deletionTimestamp"] and k8s.get("v1", "services", "owned", "default")
    k8s.patch(*IM, "owner", "default", {"metadata": {"finalizers": None}})
    assert k8s.get(*IM, "owner", "default") is None
    assert k8s.get("v1", "services", "owned", "default") is None  # garbage-collected
    # a child created after its owner went (a reconcile racing the deletion) is collected too
    k8s.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "late", "namespace": "default",
                                                                    "ownerReferences": [ref]}, "spec": {}})
    assert k8s.get("v1", "services", "late", "default") is None
    k8s.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "unowned", "namespace": "default"},
                "spec": {}})
    assert k8s.get("v1", "services", "unowned", "default") is not None


def test_watch_resumes_after_a_resource_version(k8s):
    first = k8s.create(model("watch-a"))
    k8s.create(model("watch-b"))
    params = {"watch": "true", "resourceVersion": first["metadata"]["resourceVersion"], "timeoutSeconds": "1"}
    with httpx.stream("GET", f"{k8s.url}/apis/flotilla.dev/v1alpha1/namespaces/default/inferencemodels",
                      params=params, timeout=5) as response:
        events = [json.loads(line) for line in response.iter_lines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "watch-b")]


def test_namespaces_are_served(k8s):
    names = [n["metadata"]["name"] for n in k8s.request("GET", "/api/v1/namespaces")["items"]]
    assert "default" in names
    assert k8s.request("GET", "/api/v1/namespaces/default")["kind"] == "Namespace"


def test_discovery_lists_subresources_and_short_names(k8s):
    resources = k8s.request("GET", "/apis/flotilla.dev/v1alpha1")["resources"]
    names = {r["name"] for r in resources}
    assert {"inferencemodels", "inferencemodels/status", "inferencemodels/scale"} <= names
    assert resources[0]["shortNames"] == ["im"]


def test_patch_semantics():
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}
    assert json_patch({"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3},
                                      {"op": "replace", "path": "/b", "value": 1}]) == {"a": [1, 2, 3], "b": 1}
    assert labels_match({"a": "1", "b": "2"}, "a=1,b in (2,3),!c")
    assert not labels_match({"a": "1"}, "a!=1")


def test_builtin_kinds_get_the_api_servers_defaults_and_canonical_quantities(k8s):
    container = {"name": "c", "image": "img:1", "resources": {"limits": {"cpu": "0.5", "memory": "1.5Gi"}},
                 "ports": [{"containerPort": 80}], "startupProbe": {"httpGet": {"path": "/", "port": 80}}}
    stored = k8s.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "default"},
                         "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                             "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [container]}}}})
    spec = stored["spec"]
    assert (spec["replicas"], spec["revisionHistoryLimit"], spec["progressDeadlineSeconds"]) == (1, 10, 600)
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    pod = spec["template"]["spec"]
    assert (pod["dnsPolicy"], pod["schedulerName"], pod["restartPolicy"]) == ("ClusterFirst", "default-scheduler", "Always")
    (c,) = pod["containers"]
    assert c["terminationMessagePath"] == "/dev/termination-log" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["resources"] == {"limits": {"cpu": "500m", "memory": "1536Mi"}, "requests": {"cpu": "500m", "memory": "1536Mi"}}
    assert c["startupProbe"]["periodSeconds"] == 10 and c["ports"][0]["protocol"] == "TCP"
    service = k8s.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "default"},
                          "spec": {"ports": [{"port": 80}]}})
    ip = service["spec"]["clusterIP"]
    assert service["spec"]["sessionAffinity"] == "None" and service["spec"]["ports"][0]["targetPort"] == 80
    replaced = k8s.request("PUT", "/api/v1/namespaces/default/services/s", json={
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "default"},
        "spec": {"ports": [{"port": 81}]}})
    assert replaced["spec"]["clusterIP"] == ip  # allocated once, kept
    with pytest.raises(ApiError) as refused:
        k8s.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                    "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": "lots"}}}]}})
    assert refused.value.code == 422 and "quantities must match" in refused.value.message
