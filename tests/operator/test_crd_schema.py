"""The generated CRD schema as the API server applies it: examples accepted, invalid specs refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from flotilla_operator import types

from tests.support.crd_schema import admit, validate
from tests.support.examples import EXAMPLES, crd_schema, load_example


def _valid() -> dict[str, Any]:
    return {
        "apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": "m", "namespace": "default"},
        "spec": {"model": {"name": "m", "source": {"builtin": "tiny"}}},
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted_with_defaults_applied(path):
    stored, errors = admit(crd_schema(), load_example(path))
    assert errors == []
    server, scaling = stored["spec"]["server"], stored["spec"]["scaling"]
    assert server["blockSize"] == 16 and server["queueDepthPerSlot"] == 8  # defaulted where not given
    assert scaling["disabled"] is False and "scaleUpStabilizationSeconds" in scaling
    # The CRD's defaults and the pydantic models agree: parsing either form gives the same spec.
    assert types.parse_spec(stored["spec"]) == types.parse_spec(load_example(path)["spec"])


def test_minimal_spec_gets_every_nested_default():
    stored, errors = admit(crd_schema(), _valid())
    assert errors == []
    assert stored["spec"]["placement"] == {"policy": "latency-first"}
    assert stored["spec"]["resources"] == {"gpus": 0, "cpu": "2", "memory": "8Gi"}
    assert stored["spec"]["replicas"] == 1
    assert types.parse_spec(stored["spec"]).model_dump() == types.parse_spec(_valid()["spec"]).model_dump()


def test_unknown_fields_are_pruned_not_stored():
    obj = _valid()
    obj["spec"]["server"] = {"maxNumSeq": 4}  # a typo: the API server drops it, as Kubernetes does
    stored, errors = admit(crd_schema(), obj)
    assert errors == [] and "maxNumSeq" not in stored["spec"]["server"]


def _with(path: str, value: Any):
    def mutate(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return mutate


def _drop_name(spec: dict[str, Any]) -> None:
    del spec["model"]["name"]


INVALID = [
    ("min greater than max", _with("scaling", {"minReplicas": 5, "maxReplicas": 2}),
     "spec.scaling: scaling.minReplicas must not exceed scaling.maxReplicas"),
    ("latency-first with min 0", _with("scaling", {"minReplicas": 0}),
     "spec: placement.policy latency-first requires scaling.minReplicas >= 1; use cost-first to scale to zero"),
    ("two model sources", _with("model.source", {"builtin": "tiny", "pvc": {"claimName": "models"}}),
     "spec.model.source: model.source must set exactly one of huggingface, pvc, image or builtin"),
    ("no model source", _with("model.source", {}),
     "spec.model.source: model.source must set exactly one of huggingface, pvc, image or builtin"),
    ("negative GPUs", _with("resources.gpus", -1), "spec.resources.gpus: -1 is less than the minimum of 0"),
    ("unknown policy", _with("placement.policy", "fastest"),
     "spec.placement.policy: 'fastest' is not one of ['latency-first', 'cost-first', 'adaptive']"),
    ("adaptive without a pool", _with("placement.policy", "adaptive"),
     "spec: placement.policy adaptive needs spec.pool: the ModelPool it moves to and from"),
    ("tiering without adaptive", _with("tiering", {"windowSeconds": 60}),
     "spec: tiering applies to placement.policy adaptive only; remove it or set the policy to adaptive"),
    ("tiering thresholds without a gap", _with("tiering", {"promoteDemandReplicas": 0.5, "demoteDemandReplicas": 0.5}),
     "spec.tiering: tiering.demoteDemandReplicas must be less than tiering.promoteDemandReplicas"),
    ("tiering attainments crossed", _with("tiering", {"promoteAttainment": 0.99, "demoteAttainment": 0.9}),
     "spec.tiering: tiering.promoteAttainment must not exceed tiering.demoteAttainment"),
    ("tiering attainment of zero", _with("tiering.promoteAttainment", 0),
     "spec.tiering.promoteAttainment: 0 is less than or equal to the minimum of 0"),
    ("block size not a power of two", _with("server.blockSize", 24),
     "spec.server: server.blockSize must be a power of two between 1 and 256"),
    ("maxBatchedTokens below prefillChunk", _with("server", {"maxBatchedTokens": 256, "prefillChunk": 512}),
     "spec.server: server.maxBatchedTokens must be at least server.prefillChunk"),
    ("maxBatchedTokens below maxNumSeqs", _with("server", {"maxBatchedTokens": 64, "prefillChunk": 32, "maxNumSeqs": 128}),
     "spec.server: server.maxBatchedTokens must be at least server.maxNumSeqs (one decode token per running sequence)"),
    ("gpuType without GPUs", _with("resources.gpuType", "NVIDIA-L4"), "spec: resources.gpuType needs resources.gpus > 0"),
    ("KV fraction above 1", _with("server.kvCacheMemoryFraction", 1.5),
     "spec.server.kvCacheMemoryFraction: 1.5 is greater than the maximum of 1"),
    ("KV fraction zero", _with("server.kvCacheMemoryFraction", 0),
     "spec.server.kvCacheMemoryFraction: 0 is less than or equal to the minimum of 0"),
    ("memory not a quantity", _with("resources.memory", "lots"), "spec.resources.memory: 'lots' does not match"),
    ("missing model name", _drop_name, "spec.model: 'name' is a required property"),
    ("Hugging Face repo without owner", _with("model.source", {"huggingface": {"repo": "llama"}}),
     "spec.model.source.huggingface.repo: 'llama' does not match"),
    ("unknown builtin model", _with("model.source", {"builtin": "huge"}),
     "spec.model.source.builtin: 'huge' is not one of ['tiny']"),
    ("negative replicas", _with("replicas", -1), "spec.replicas: -1 is less than the minimum of 0"),
    ("PVC name with capitals", _with("model.source", {"pvc": {"claimName": "Models"}}),
     "spec.model.source.pvc.claimName: 'Models' does not match"),
    ("unknown dtype", _with("server.dtype", "int4"), "spec.server.dtype: 'int4' is not one of"),
    ("image source copying the whole root", _with("model.source", {"image": {"reference": "r/m:1", "path": "/"}}),
     "spec.model.source.image.path: '/' does not match"),
    ("Hugging Face file that is not a GGUF", _with("model.source", {"huggingface": {"repo": "o/m", "file": "model.safetensors"}}),
     "spec.model.source.huggingface.file: 'model.safetensors' does not match"),
    ("Hugging Face file climbing out of the volume", _with("model.source", {"huggingface": {"repo": "o/m", "file": "../x.gguf"}}),
     "spec.model.source.huggingface.file: '../x.gguf' does not match"),
    ("no queue places", _with("server.queueDepthPerSlot", 0),
     "spec.server.queueDepthPerSlot: 0 is less than the minimum of 1"),
    ("zero queue timeout", _with("server.queueTimeoutSeconds", 0),
     "spec.server.queueTimeoutSeconds: 0 is less than or equal to the minimum of 0"),
    ("unknown request class", _with("server.classes.weights", {"bulk": 1}),
     "spec.server.classes.weights: server.classes.weights may name only interactive and batch"),
    ("zero class weight", _with("server.classes.weights", {"batch": 0}),
     "spec.server.classes.weights.batch: 0 is less than or equal to the minimum of 0"),
    ("reserve of every slot", _with("server", {"maxNumSeqs": 8, "classes": {"interactiveReserveSlots": 8}}),
     "spec.server: server.classes.interactiveReserveSlots must be less than server.maxNumSeqs, or batch work never runs"),
    ("negative reserve", _with("server.classes.interactiveReserveSlots", -1),
     "spec.server.classes.interactiveReserveSlots: -1 is less than the minimum of 0"),
    ("per-class timeout for an unknown class", _with("server.classes.queueTimeoutSeconds", {"bulk": 60}),
     "spec.server.classes.queueTimeoutSeconds: server.classes.queueTimeoutSeconds may name only interactive and batch"),
    ("zero per-class timeout", _with("server.classes.queueTimeoutSeconds", {"batch": 0}),
     "spec.server.classes.queueTimeoutSeconds.batch: 0 is less than or equal to the minimum of 0"),
    ("zero tenant weight", _with("server.classes.tenantWeights", {"team-a": 0}),
     "spec.server.classes.tenantWeights.team-a: 0 is less than or equal to the minimum of 0"),
    ("tenant cap of zero", _with("server.classes.tenantMaxQueued", 0),
     "spec.server.classes.tenantMaxQueued: 0 is less than the minimum of 1"),
    ("batch demand weight above 1", _with("scaling.batchDemandWeight", 1.5),
     "spec.scaling.batchDemandWeight: 1.5 is greater than the maximum of 1"),
]


@pytest.mark.parametrize(("case", "mutate", "message"), INVALID, ids=[case for case, _, _ in INVALID])
def test_invalid_spec_is_rejected_with_its_message(case, mutate, message):
    obj = _valid()
    mutate(obj["spec"])
    _, errors = admit(crd_schema(), obj)
    assert any(message in error for error in errors), f"{case}: got {errors}"


def test_every_class_field_is_optional_and_defaulted_from_the_contract():
    from flotilla_contract import classes as c

    stored, errors = admit(crd_schema(), _valid())
    assert errors == []
    assert stored["spec"]["server"]["classes"] == {
        "weights": c.DEFAULT_CLASS_WEIGHTS, "batchMaxPreemptions": c.DEFAULT_BATCH_MAX_PREEMPTIONS,
        "batchPrefillTokens": c.DEFAULT_BATCH_PREFILL_TOKENS}
    assert stored["spec"]["scaling"]["batchDemandWeight"] == 0
    parsed = types.parse_spec(stored["spec"])
    assert parsed == types.parse_spec(_valid()["spec"])  # a spec stored before classes existed reads the same
    assert parsed.server.classes.interactive_reserve_slots is None and parsed.server.classes.tenant_weights == {}


def test_a_full_classes_spec_is_admitted():
    obj = _valid()
    obj["spec"]["server"] = {"maxNumSeqs": 16, "classes": {
        "weights": {"interactive": 4, "batch": 1.5}, "interactiveReserveSlots": 15, "batchMaxPreemptions": 0,
        "batchPrefillTokens": 128, "queueTimeoutSeconds": {"batch": 600}, "tenantWeights": {"team-a": 2, "b@x.io": 0.5},
        "tenantMaxRunning": 4, "tenantMaxQueued": 32}}
    obj["spec"]["scaling"] = {"batchDemandWeight": 0.25}
    stored, errors = admit(crd_schema(), obj)
    assert errors == []
    assert types.parse_spec(stored["spec"]).server.classes.tenant_weights == {"team-a": 2, "b@x.io": 0.5}


@pytest.mark.parametrize("name", ["a,b", "a=b", "team a", ""])
def test_a_tenant_name_the_servers_lists_cannot_carry_is_refused_with_what_to_change(name):
    with pytest.raises(ValueError, match="no commas, `=` or spaces"):
        types.parse_spec({**_valid()["spec"], "server": {"classes": {"tenantWeights": {name: 1}}}})


def test_cost_first_may_scale_to_zero():
    obj = _valid()
    obj["spec"]["placement"] = {"policy": "cost-first"}
    obj["spec"]["scaling"] = {"minReplicas": 0}
    assert admit(crd_schema(), obj)[1] == []


def test_cel_rules_run_only_on_otherwise_valid_objects():
    obj = _valid()
    obj["spec"]["scaling"] = {"minReplicas": "one"}  # a type error, not a CEL evaluation crash
    errors = validate(crd_schema(), admit(crd_schema(), copy.deepcopy(obj))[0])
    assert errors == ["spec.scaling.minReplicas: 'one' is not of type 'integer'"]
