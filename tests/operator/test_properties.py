"""Property tests: for any spec the CRD admits, the builders produce manifests Kubernetes and the server accept."""

from __future__ import annotations

import kubernetes_validate
from flotilla_contract.classes import DEFAULT_CLASS_WEIGHTS
from flotilla_operator import types
from flotilla_operator.manifests import Owner, desired_children, desired_replicas
from flotilla_server.cli import parse_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.crd_schema import admit
from tests.support.examples import crd_schema

SOURCES = st.one_of(
    st.just({"builtin": "tiny"}),
    st.builds(lambda c, p: {"pvc": {"claimName": c, "path": p}}, st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True),
              st.sampled_from(["", "llama", "a/b"])),
    st.builds(lambda r: {"huggingface": {"repo": r}}, st.sampled_from(["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B"])),
    st.builds(lambda ref: {"image": {"reference": ref}}, st.sampled_from(["registry.example/m:1", "m@sha256:" + "a" * 64])),
)


@st.composite
def specs(draw) -> dict:
    policy = draw(st.sampled_from(["latency-first", "cost-first"]))
    low = draw(st.integers(1 if policy == "latency-first" else 0, 5))
    high = draw(st.integers(max(low, 1), 10))
    max_num_seqs = draw(st.integers(1, 256))
    prefill = draw(st.integers(1, 2048))
    gpus = draw(st.integers(0, 8))
    spec = {
        "model": {"name": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9./_-]{0,40}", fullmatch=True)), "source": draw(SOURCES)},
        "replicas": draw(st.integers(0, 12)),
        "resources": {"gpus": gpus, "memory": draw(st.sampled_from(["1Gi", "8Gi", "500Mi"]))},
        "scaling": {"minReplicas": low, "maxReplicas": high, "disabled": draw(st.booleans())},
        "placement": {"policy": policy, "nodeSelector": draw(st.dictionaries(
            st.sampled_from(["team", "zone", "nvidia.com/gpu.product"]), st.sampled_from(["a", "b"]), max_size=2))},
        "server": {
            "maxNumSeqs": max_num_seqs, "prefillChunk": prefill,
            "maxBatchedTokens": max(max_num_seqs, prefill) + draw(st.integers(0, 1024)),
            "blockSize": draw(st.sampled_from(types.BLOCK_SIZES)),
            "drainTimeoutSeconds": draw(st.floats(0, 600).map(lambda x: round(x, 1))),
        },
    }
    if draw(st.booleans()):  # request classes: any the CRD admits, the server must accept
        positive = st.floats(0.01, 100).map(lambda x: round(x, 2))
        classes = {"weights": draw(st.dictionaries(st.sampled_from(["interactive", "batch"]), positive, max_size=2)),
                   "queueTimeoutSeconds": draw(st.dictionaries(st.sampled_from(["interactive", "batch"]), positive,
                                                               max_size=2)),
                   "tenantWeights": draw(st.dictionaries(st.from_regex(r"[a-z0-9][a-z0-9.@-]{0,12}", fullmatch=True),
                                                         positive, max_size=3)),
                   "batchMaxPreemptions": draw(st.integers(0, 100)), "batchPrefillTokens": draw(st.integers(0, 512))}
        if draw(st.booleans()):
            classes["interactiveReserveSlots"] = draw(st.integers(0, max_num_seqs - 1))
        for cap in ("tenantMaxRunning", "tenantMaxQueued"):
            if draw(st.booleans()):
                classes[cap] = draw(st.integers(1, 64))
        spec["server"]["classes"] = classes
        spec["scaling"]["batchDemandWeight"] = draw(st.sampled_from([0, 0.5, 1]))
    if gpus and draw(st.booleans()):
        spec["resources"].update(gpuType="NVIDIA-L4", gpuMemory="24Gi")
        spec["server"]["kvCacheMemoryFraction"] = draw(st.sampled_from([0.1, 0.5, 0.9]))
    return spec


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_admitted_specs_build_valid_manifests_the_server_accepts(spec):
    obj = {"apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": "m", "namespace": "ns"}, "spec": spec}
    stored, errors = admit(crd_schema(), obj)
    assert errors == []
    parsed = types.parse_spec(stored["spec"])
    owner = Owner("m", "ns", "uid", parsed)
    children = {c["kind"]: c for c in desired_children(owner, types.DEFAULT_SERVER_IMAGE, monitoring=False)}
    deployment = children["Deployment"]
    for child in children.values():
        kubernetes_validate.validate(child, "1.37.0", strict=True)
    replicas = deployment["spec"]["replicas"]
    assert replicas == desired_replicas(parsed)
    if not parsed.scaling.disabled:
        assert parsed.scaling.min_replicas <= replicas <= parsed.scaling.max_replicas
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > parsed.server.drain_timeout_seconds
    assert spec["placement"]["nodeSelector"].items() <= pod.get("nodeSelector", {}).items()
    assert ("PodDisruptionBudget" in children) == (parsed.placement.policy == "latency-first")
    server = parse_settings(pod["containers"][0]["args"], environ={})
    assert server.max_num_seqs == parsed.server.max_num_seqs and server.block_size == parsed.server.block_size
    assert server.device == ("cuda" if parsed.resources.gpus else "cpu")
    classes = parsed.server.classes
    assert server.class_weight_map == {**DEFAULT_CLASS_WEIGHTS, **classes.weights}
    assert server.tenant_weight_map == classes.tenant_weights and server.class_timeouts_s == classes.queue_timeout_seconds
    assert (server.tenant_max_running, server.tenant_max_queued) == (classes.tenant_max_running, classes.tenant_max_queued)
