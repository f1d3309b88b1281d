"""Pure manifest builders: what each example renders to, and that Kubernetes would accept it."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from flotilla_contract import flags as server_flags
from flotilla_contract.sizes import parse_bytes
from flotilla_operator import types
from flotilla_operator.manifests import Owner, desired_children, desired_replicas
from flotilla_operator.settings import DEFAULT_OPERATOR_IMAGE
from flotilla_server.cli import parse_settings

from tests.support.examples import EXAMPLES, ROOT, load_example

DEFAULT_IMAGE = types.DEFAULT_SERVER_IMAGE
BUILTIN_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}


def owner_of(example: str | dict[str, Any]) -> Owner:
    obj = load_example(ROOT / "examples" / example) if isinstance(example, str) else example
    meta = obj["metadata"]
    return Owner(meta["name"], meta["namespace"], "0d4b3c2a-1111-2222-3333-444455556666", types.parse_spec(obj["spec"]))


def children(owner: Owner, monitoring: bool = False) -> dict[str, dict[str, Any]]:
    return {child["kind"]: child for child in desired_children(owner, DEFAULT_IMAGE, monitoring)}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_built_manifest_passes_kubernetes_validate_strict(path, version):
    for child in desired_children(owner_of(path.name), DEFAULT_IMAGE, monitoring=True):
        if child["kind"] in BUILTIN_KINDS:  # ServiceMonitor is a CRD kind that the validator does not know
            kubernetes_validate.validate(child, version, strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_rendered_args_parse_with_the_servers_own_flags(path):
    owner = owner_of(path.name)
    settings = parse_settings(container(children(owner)["Deployment"])["args"], environ={})
    server = owner.spec.server
    assert settings.max_num_seqs == server.max_num_seqs
    assert settings.max_num_batched_tokens == server.max_batched_tokens
    assert settings.prefill_chunk == server.prefill_chunk
    assert settings.block_size == server.block_size
    assert settings.served_model_name == owner.spec.model.name
    assert settings.port == 8000


def test_tiny_cpu_example():
    owner = owner_of("tiny-cpu.yaml")
    kids = children(owner)
    assert set(kids) == {"Service", "Deployment"}  # cost-first: no PDB
    deployment = kids["Deployment"]
    args = container(deployment)["args"]
    assert flag(args, "--model") == "tiny" and flag(args, "--device") == "cpu"
    assert flag(args, "--max-num-seqs") == "8" and flag(args, "--dtype") == "auto"  # the server picks per model and CPU
    assert "nvidia.com/gpu" not in container(deployment)["resources"]["limits"]
    assert "initContainers" not in deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1


def test_llama_example_gpu_huggingface_latency_first():
    owner = owner_of("llama-3.1-8b-latency-first.yaml")
    kids = children(owner)
    assert set(kids) == {"Service", "Deployment", "PodDisruptionBudget", "NetworkPolicy"}
    pod = kids["Deployment"]["spec"]["template"]["spec"]
    server = container(kids["Deployment"])
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert server["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    args = server["args"]
    assert flag(args, "--model") == "/models/model"
    assert flag(args, "--device") == "cuda" and flag(args, "--dtype") == "bfloat16"
    assert flag(args, "--gpu-memory-utilization") == "0.9" and "--kv-cache-memory" not in args
    assert flag(args, "--max-model-len") == "8192" and flag(args, "--queue-timeout-s") == "10"
    download = pod["initContainers"][0]
    assert download["command"][:3] == ["hf", "download", "meta-llama/Llama-3.1-8B-Instruct"]
    token = next(e for e in download["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    offline = next(e for e in download["env"] if e["name"] == "HF_HUB_OFFLINE")
    assert offline["value"] == "0"  # the image's HF_HUB_OFFLINE=1 would make `hf download` refuse
    assert kids["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    assert kids["Deployment"]["spec"]["replicas"] == 2


def test_qwen_example_pvc_cost_first():
    kids = children(owner_of("qwen2.5-7b-cost-first.yaml"))
    pod = kids["Deployment"]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in container(kids["Deployment"])["volumeMounts"] if m["name"] == "model")
    assert mount["readOnly"] is True
    assert flag(container(kids["Deployment"])["args"], "--model") == "/models/qwen2.5-7b-instruct"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4", "cloud.google.com/gke-nodepool": "gpu-spot"}
    assert "PodDisruptionBudget" not in kids


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_probes_lifecycle_security_labels_and_owner(path):
    owner = owner_of(path.name)
    for child in desired_children(owner, DEFAULT_IMAGE, monitoring=True):
        meta = child["metadata"]
        assert meta["ownerReferences"] == [{
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceModel", "name": owner.name,
            "uid": owner.uid, "controller": True, "blockOwnerDeletion": True,
        }]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "flotilla-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == owner.name
        assert meta["labels"]["app.kubernetes.io/version"] == "0.1.0"
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of"} <= set(meta["labels"])
    deployment = children(owner)["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    server = container(deployment)
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120  # sized for model loading
    assert pod["terminationGracePeriodSeconds"] > owner.spec.server.drain_timeout_seconds
    assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    assert server["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    writable = {m["mountPath"] for m in server["volumeMounts"] if not m.get("readOnly")}
    assert "/tmp" in writable  # scratch space despite the read-only root
    for init in pod.get("initContainers", []):
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template_labels.items()


def test_image_source_copies_the_model_in_an_init_container():
    obj = load_example(ROOT / "examples" / "tiny-cpu.yaml")
    obj["spec"]["model"]["source"] = {"image": {"reference": "registry.example/models/qwen:1", "path": "/weights"}}
    deployment = children(owner_of(obj))["Deployment"]
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert init["image"] == "registry.example/models/qwen:1"
    assert init["command"] == ["cp", "-R", "/weights", "/models/model"]
    assert flag(container(deployment)["args"], "--model") == "/models/model"
    for version in ("1.30.0", "1.37.0"):
        kubernetes_validate.validate(deployment, version, strict=True)


def test_a_gguf_source_hands_the_server_the_file_itself():
    """A GGUF arrives as one file; `--model` must name it, since the server reads the type from its name."""
    obj = load_example(ROOT / "examples" / "smollm2-135m-instruct.yaml")
    deployment = children(owner_of(obj))["Deployment"]
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    hf = obj["spec"]["model"]["source"]["huggingface"]
    assert init["command"] == ["hf", "download", hf["repo"], hf["file"], "--revision", hf["revision"],
                               "--local-dir", "/models/model"]
    assert flag(container(deployment)["args"], "--model") == f"/models/model/{hf['file']}"

    obj["spec"]["model"]["source"] = {"image": {"reference": "registry.example/models/smol:1", "path": "/w/smol.Q4_1.gguf"}}
    deployment = children(owner_of(obj))["Deployment"]
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"] == ["cp", "-R", "/w/smol.Q4_1.gguf", "/models/smol.Q4_1.gguf"]
    assert flag(container(deployment)["args"], "--model") == "/models/smol.Q4_1.gguf"

    obj["spec"]["model"]["source"] = {"pvc": {"claimName": "models", "path": "smol/smol.Q4_1.gguf"}}
    deployment = children(owner_of(obj))["Deployment"]
    assert flag(container(deployment)["args"], "--model") == "/models/smol/smol.Q4_1.gguf"
    for version in ("1.30.0", "1.37.0"):
        kubernetes_validate.validate(deployment, version, strict=True)


def test_the_deprecated_kv_fraction_is_still_rendered_unless_gpu_memory_utilization_is_set():
    spec = {"model": {"name": "m", "source": {"builtin": "tiny"}}, "resources": {"memory": "8Gi"},
            "server": {"kvCacheMemoryFraction": 0.5}}
    args = container(children(owner_of({"metadata": {"name": "m", "namespace": "d"}, "spec": spec}))["Deployment"])["args"]
    assert int(flag(args, "--kv-cache-memory")) == parse_bytes("4Gi")
    spec["server"]["gpuMemoryUtilization"] = 0.8
    args = container(children(owner_of({"metadata": {"name": "m", "namespace": "d"}, "spec": spec}))["Deployment"])["args"]
    assert flag(args, "--gpu-memory-utilization") == "0.8" and "--kv-cache-memory" not in args


def test_defaults_come_from_the_contract_flag_table():
    args = container(children(owner_of({"metadata": {"name": "m", "namespace": "d"},
                                         "spec": {"model": {"name": "m", "source": {"builtin": "tiny"}}}}))["Deployment"])["args"]
    assert flag(args, "--max-num-seqs") == str(server_flags.DEFAULT_MAX_NUM_SEQS)
    assert flag(args, "--max-num-batched-tokens") == str(server_flags.DEFAULT_MAX_NUM_BATCHED_TOKENS)
    assert flag(args, "--block-size") == str(server_flags.DEFAULT_BLOCK_SIZE)
    assert "--kv-cache-memory" not in args  # unset fraction: the server sizes its own pool
    assert "--gpu-memory-utilization" not in args  # unset: the server's own default


CLASS_FLAGS = ("--class-weights", "--interactive-reserve-slots", "--class-queue-timeout-s", "--batch-max-preemptions",
               "--batch-prefill-tokens", "--tenant-weights", "--tenant-max-running", "--tenant-max-queued")


def args_of(server: dict[str, Any]) -> list[str]:
    spec = {"model": {"name": "m", "source": {"builtin": "tiny"}}, "server": server}
    return container(children(owner_of({"metadata": {"name": "m", "namespace": "d"}, "spec": spec}))["Deployment"])["args"]


@pytest.mark.parametrize("classes", [{}, {"weights": {"interactive": 8, "batch": 1}, "batchMaxPreemptions": 4,
                                          "batchPrefillTokens": 64, "queueTimeoutSeconds": {}, "tenantWeights": {}}])
def test_classes_at_their_defaults_render_no_flag(classes):
    # the arguments of a spec that leaves classes alone are those rendered before classes existed:
    # no rollout on an operator upgrade, and a pinned older server image meets no flag it does not know
    assert not set(CLASS_FLAGS) & set(args_of({"classes": classes}))


def test_classes_render_to_the_servers_flags_and_parse_back():
    args = args_of({"maxNumSeqs": 16, "queueTimeoutSeconds": 20, "classes": {
        "weights": {"batch": 2}, "interactiveReserveSlots": 0, "batchMaxPreemptions": 1, "batchPrefillTokens": 32,
        "queueTimeoutSeconds": {"batch": 600, "interactive": 2.5}, "tenantWeights": {"team-b": 1, "team-a": 1234567.5},
        "tenantMaxRunning": 4, "tenantMaxQueued": 8}})
    assert flag(args, "--class-weights") == "interactive=8,batch=2"  # a class left out keeps its default
    assert flag(args, "--interactive-reserve-slots") == "0"  # set to 0 (reserve off) is not unset
    assert flag(args, "--class-queue-timeout-s") == "interactive=2.5,batch=600"  # classes in urgency order
    assert flag(args, "--tenant-weights") == "team-a=1234567.5,team-b=1"  # sorted by name, no digit lost
    assert (flag(args, "--batch-max-preemptions"), flag(args, "--batch-prefill-tokens")) == ("1", "32")
    assert (flag(args, "--tenant-max-running"), flag(args, "--tenant-max-queued")) == ("4", "8")
    settings = parse_settings(args, environ={})  # the server's own parser and checks
    assert settings.class_weights == "interactive=8,batch=2" and settings.interactive_reserve_slots == 0
    assert settings.class_queue_timeout_s == "interactive=2.5,batch=600"
    assert (settings.batch_max_preemptions, settings.batch_prefill_tokens) == (1, 32)
    assert settings.tenant_weight_map == {"team-a": 1234567.5, "team-b": 1}
    assert (settings.tenant_max_running, settings.tenant_max_queued) == (4, 8)


def test_spec_image_overrides_the_default_and_sets_the_version_label():
    obj = load_example(ROOT / "examples" / "tiny-cpu.yaml")
    obj["spec"]["image"] = "registry.example/flotilla-server:0.2.0-rc1"
    deployment = children(owner_of(obj))["Deployment"]
    assert container(deployment)["image"] == "registry.example/flotilla-server:0.2.0-rc1"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == "0.2.0-rc1"
    assert DEFAULT_OPERATOR_IMAGE.endswith(":0.1.0")


def test_service_monitor_only_when_the_api_exists():
    owner = owner_of("tiny-cpu.yaml")
    assert "ServiceMonitor" not in children(owner, monitoring=False)
    monitor = children(owner, monitoring=True)["ServiceMonitor"]
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]


@pytest.mark.parametrize(("replicas", "low", "high", "disabled", "expected"), [
    (1, 1, 4, False, 1), (0, 1, 4, False, 1), (9, 1, 4, False, 4), (0, 0, 4, False, 0), (9, 1, 4, True, 9),
])
def test_desired_replicas_clamp_unless_scaling_is_disabled(replicas, low, high, disabled, expected):
    spec = types.parse_spec({"model": {"name": "m", "source": {"builtin": "tiny"}}, "replicas": replicas,
                             "placement": {"policy": "cost-first"},
                             "scaling": {"minReplicas": low, "maxReplicas": high, "disabled": disabled}})
    assert desired_replicas(spec) == expected


@pytest.mark.parametrize("quantization", [None, "none", "gguf"])
def test_spec_server_quantization_reaches_the_server_and_parses(quantization):
    obj = load_example(ROOT / "examples" / "tiny-cpu.yaml")
    if quantization is not None:
        obj["spec"].setdefault("server", {})["quantization"] = quantization
    args = container(children(owner_of(obj))["Deployment"])["args"]
    assert parse_settings(args, environ={}).quantization == quantization  # unset: the server picks by source
