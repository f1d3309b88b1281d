"""The InferenceModel API (flotilla.dev/v1alpha1) as pydantic models: the single source of truth.

`generate.py` turns these models into the CRD's structural schema and into docs/operator.md, so
every field description starts with the field's name and every cross-field rule is a CEL rule
(`x-kubernetes-validations`) with a message that says what to change.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from flotilla_contract import classes as request_classes
from flotilla_contract import flags as server_flags
from flotilla_contract import metrics as server_metrics
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from flotilla_operator.tiering_types import MoveStatus, TieringSpec, TieringStatus

GROUP = "flotilla.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceModel"
PLURAL = "inferencemodels"
SINGULAR = "inferencemodel"
SHORT_NAMES = ("im",)

DEFAULT_SERVER_IMAGE = "ghcr.io/flotilla-dev/flotilla-server:0.1.0"
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# a relative path of a `.gguf` file: segments never start with a dot, so no `..` and no hidden file
GGUF_RELATIVE_PATH = r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*\.gguf$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"
# a tenant name as the server's NAME=VALUE lists can carry it: no `,`, `=` or spaces (X-Flotilla-Tenant, `user`)
TENANT_NAME = r"^[A-Za-z0-9_][A-Za-z0-9._:@/+-]{0,127}$"
MAX_TENANTS = 256  # named tenants in one of spec.server.classes' tenant maps
MAX_ADAPTERS = 256  # spec.adapters' length: bounds the CRD's CEL cost and the list file
# an adapter's name: a DNS-1123 label, which is also a served name the servers' lists carry (model_list.NAME_PATTERN)
ADAPTER_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# a relative path inside a volume, or empty (the volume's root): segments never start with a dot, so no `..`
RELATIVE_PATH = r"^([A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*)?$"
ADAPTER_HUGGINGFACE_REFUSED = (
    "adapters[].source.huggingface is not supported: the servers' pods have no network at run time, and an init "
    "container downloading each adapter would restart every pod whenever an adapter is added; copy the adapter "
    "into a PersistentVolumeClaim (source.pvc) or an OCI image (source.image)")


def rules(*pairs: tuple[str, str]) -> dict[str, Any]:
    """A pydantic json_schema_extra carrying CEL rules as (rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in pairs]}


class ApiModel(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class SecretKeyRef(ApiModel):
    name: str = Field(description="name is the Secret in the InferenceModel's namespace.", min_length=1)
    key: str = Field("token", description="key is the entry of the Secret that holds the token.", min_length=1)


class ApiKeySecretRef(ApiModel):
    name: str = Field(description="name is the Secret, in the same namespace.", pattern=DNS_SUBDOMAIN)
    key: str = Field("api-key", description="key is the entry of the Secret that holds the API key.", min_length=1)


class HuggingFaceSource(ApiModel):
    repo: str = Field(
        description="repo is the Hugging Face repository, as `owner/name`.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
    )
    revision: str = Field("main", description="revision is the branch, tag or commit to download.", min_length=1)
    file: str | None = Field(
        None,
        description=(
            "file downloads only this `.gguf` file of the repository (one quantization, not all of them), "
            "and the server loads it; unset downloads the whole repository as a Hugging Face model directory."
        ),
        pattern=GGUF_RELATIVE_PATH,
    )
    token_secret: SecretKeyRef | None = Field(
        None, description="tokenSecret names the Secret key holding a Hugging Face token, for gated models."
    )


class PVCSource(ApiModel):
    claim_name: str = Field(
        description="claimName is the PersistentVolumeClaim, in the same namespace, that holds the model.",
        pattern=DNS_SUBDOMAIN,
    )
    path: str = Field(
        "",
        description=(
            "path is the model inside the volume: a Hugging Face model directory or a `.gguf` file; "
            "empty means the volume's root."
        ),
    )


class ImageSource(ApiModel):
    reference: str = Field(
        description="reference is an OCI image holding the model files and a `cp` command.",
        min_length=1,
    )
    path: str = Field(
        "/model",
        description=(
            "path is the model inside the image: a Hugging Face model directory or a `.gguf` file; "
            "absolute, and not `/` itself."
        ),
        pattern=r"^/[^/]",
    )


class ModelSource(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "[has(self.huggingface), has(self.pvc), has(self.image), has(self.builtin)]"
                ".filter(x, x).size() == 1",
                "model.source must set exactly one of huggingface, pvc, image or builtin",
            ),
        )
    )

    huggingface: HuggingFaceSource | None = Field(
        None, description="huggingface downloads the model in an init container into an emptyDir volume."
    )
    pvc: PVCSource | None = Field(None, description="pvc mounts the model read-only from a PersistentVolumeClaim.")
    image: ImageSource | None = Field(
        None, description="image copies the model out of an OCI image in an init container into an emptyDir volume."
    )
    builtin: Literal["tiny"] | None = Field(
        None, description="builtin selects a model embedded in the server; `tiny` is a demonstration model only."
    )


class AdapterPVCSource(ApiModel):
    claim_name: str = Field(
        description="claimName is the PersistentVolumeClaim, in the same namespace, that holds the adapter; it is "
        "mounted read-only once per pod however many adapters it holds.",
        pattern=DNS_SUBDOMAIN,
        max_length=253,
    )
    path: str = Field(
        "",
        description="path is the adapter's PEFT directory (adapter_config.json and adapter_model.safetensors) "
        "inside the volume, relative; empty means the volume's root.",
        pattern=RELATIVE_PATH,
        max_length=1024,
    )


class AdapterImageSource(ApiModel):
    reference: str = Field(
        description="reference is an OCI image holding the adapter's PEFT directory and a `cp` command.", min_length=1
    )
    path: str = Field(
        "/adapter",
        description="path is the adapter's PEFT directory inside the image; absolute, and not `/` itself.",
        pattern=r"^/[^/]",
    )


class AdapterSource(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            ("!has(self.huggingface)", ADAPTER_HUGGINGFACE_REFUSED),
            (
                "has(self.huggingface) || [has(self.pvc), has(self.image)].filter(x, x).size() == 1",
                "adapters[].source must set exactly one of pvc or image",
            ),
        )
    )

    pvc: AdapterPVCSource | None = Field(
        None, description="pvc reads the adapter from a PersistentVolumeClaim, mounted read-only under /adapters; "
        "adding or removing such an adapter restarts no pod once its claim is mounted."
    )
    image: AdapterImageSource | None = Field(
        None, description="image copies the adapter out of an OCI image in an init container: adding or removing "
        "one changes the pod template, a rolling restart."
    )
    # any content, so that the CEL rule's message (why, and what to use) is the refusal, not a field's pattern
    huggingface: dict[str, Any] | None = Field(
        None, description="huggingface is refused for adapters: the pods have no network at run time and a "
        "download per adapter would restart them; use pvc or image."
    )

    @model_validator(mode="after")
    def _one_source(self) -> AdapterSource:
        if self.huggingface is not None:
            raise ValueError(ADAPTER_HUGGINGFACE_REFUSED)
        if (self.pvc is None) == (self.image is None):
            raise ValueError("adapters[].source must set exactly one of pvc or image")
        return self


class AdapterSpec(ApiModel):
    name: str = Field(
        description="name is what a request sends as `model` to use the adapter: a DNS-1123 label, unique within "
        "the model and not the model's own served name.",
        pattern=ADAPTER_NAME,
        max_length=63,
    )
    source: AdapterSource = Field(description="source says where the adapter's PEFT directory comes from: pvc or image.")


class ModelSpec(ApiModel):
    name: str = Field(
        description="name is the model name that clients pass to the OpenAI API (the served model name).",
        min_length=1,
        max_length=128,
    )
    source: ModelSource = Field(description="source says where the weights come from: exactly one of its fields.")


class ResourcesSpec(ApiModel):
    gpus: int = Field(0, description="gpus is the number of `nvidia.com/gpu` per replica; 0 runs on CPU.", ge=0, le=16)
    gpu_type: str | None = Field(
        None,
        description="gpuType is the `nvidia.com/gpu.product` node label value to schedule on (e.g. `NVIDIA-H100-80GB-HBM3`).",
    )
    gpu_memory: str | None = Field(
        None,
        description="gpuMemory is the memory of one GPU (a quantity, e.g. `80Gi`). Only the deprecated server.kvCacheMemoryFraction reads it; the server measures the GPU itself (server.gpuMemoryUtilization).",
        pattern=QUANTITY,
    )
    cpu: str = Field(
        "2", description="cpu is the CPU request and limit of each replica (a quantity). On a CPU pod the server runs "
                         "its engines on the whole CPUs of the limit less one (at least 1), leaving one to HTTP.",
        pattern=QUANTITY)
    memory: str = Field(
        "8Gi", description="memory is the memory request and limit of each replica (a quantity).", pattern=QUANTITY
    )


class ScalingSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            ("self.minReplicas <= self.maxReplicas", "scaling.minReplicas must not exceed scaling.maxReplicas"),
        )
    )

    min_replicas: int = Field(1, description="minReplicas is the floor of the autoscaler; 0 allows scale to zero (cost-first only).", ge=0)
    max_replicas: int = Field(4, description="maxReplicas is the ceiling of the autoscaler.", ge=1, le=1000)
    target_queue_depth: int = Field(
        8, description="targetQueueDepth is the waiting requests per replica that cost-first tolerates.", ge=0
    )
    scale_up_stabilization_seconds: int = Field(
        0, description="scaleUpStabilizationSeconds is how long a higher recommendation must hold before scaling up.", ge=0, le=3600
    )
    scale_down_stabilization_seconds: int = Field(
        300,
        description="scaleDownStabilizationSeconds is the window whose highest recommendation a scale-down may not go under.",
        ge=0,
        le=86400,
    )
    scale_to_zero_after_seconds: int = Field(
        600, description="scaleToZeroAfterSeconds is the idle time before a cost-first model with minReplicas 0 scales to zero.", ge=0
    )
    disabled: bool = Field(
        False, description="disabled hands `.spec.replicas` to someone else (kubectl scale, an HPA, KEDA)."
    )
    batch_demand_weight: float = Field(
        0.0,
        description="batchDemandWeight is how much one `batch` request (waiting or running, from the servers' "
        "flotilla_class_requests_* gauges) counts toward the autoscaler's demand, an interactive one counting 1: "
        "0 (the default) lets batch work fill idle capacity without ever scaling out for it; 1 counts it in full "
        "(docs/autoscaling.md).",
        ge=0,
        le=1,
    )


TTFT_CEILING_S = server_metrics.LATENCY_BUCKETS_S[-1]  # the TTFT histogram's top finite bucket
TPOT_CEILING_S = server_metrics.ITL_BUCKETS_S[-1]  # the inter-token histogram's top finite bucket
DEFAULT_SLO_PERCENTILE = 0.9


_SLO_MEASURES = {
    "ttft": "time to first token, per request (flotilla_time_to_first_token_seconds)",
    "tpot": "time per output token: the gap between successive tokens, per token (flotilla_inter_token_latency_seconds)",
}


def _slo_target(name: str, ceiling_s: float) -> Any:
    return Field(
        None,
        description=f"{name}Seconds is the target for the {_SLO_MEASURES[name]}: its {name}Percentile must stay at "
        f"or under it. Above 0 and at most {ceiling_s:g} (the servers' histogram cannot tell a percentile above its "
        "top bucket apart from it, so a higher target could never be seen missed).",
        gt=0,
        le=ceiling_s,
    )


def _slo_percentile(name: str) -> Any:
    return Field(
        DEFAULT_SLO_PERCENTILE,
        description=f"{name}Percentile is the percentile {name}Seconds bounds, as a fraction strictly between 0 "
        "and 1 (0.9: the p90).",
        gt=0,
        lt=1,
    )


class SloSpec(ApiModel):
    """A latency objective the autoscaler holds beside its queue-depth rule (docs/autoscaling.md, "SLO scaling")."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            ("has(self.ttftSeconds) || has(self.tpotSeconds)",
             "slo must set ttftSeconds, tpotSeconds or both; remove slo to scale on queue depth alone"),
        )
    )

    ttft_seconds: float | None = _slo_target("ttft", TTFT_CEILING_S)
    ttft_percentile: float = _slo_percentile("ttft")
    tpot_seconds: float | None = _slo_target("tpot", TPOT_CEILING_S)
    tpot_percentile: float = _slo_percentile("tpot")
    window_seconds: int = Field(
        60,
        description="windowSeconds is how far back the percentiles are measured (the rate window of the servers' "
        "histograms in Prometheus). It must span at least two of Prometheus' scrapes; until it does, the "
        "autoscaler holds and says so.",
        ge=2,
        le=3600,
    )

    @model_validator(mode="after")
    def _some_target(self) -> SloSpec:
        """What the CEL rule refuses, for specs that did not pass through the API server."""
        if self.ttft_seconds is None and self.tpot_seconds is None:
            raise ValueError("slo must set ttftSeconds, tpotSeconds or both; remove slo to scale on queue depth alone")
        return self


class Toleration(ApiModel):
    key: str | None = Field(None, description="key is the taint key; empty with operator Exists tolerates everything.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="operator is Exists or Equal.")
    value: str | None = Field(None, description="value is the taint value to match with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="effect is the taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None, description="tolerationSeconds bounds how long a NoExecute taint is tolerated."
    )


class PlacementSpec(ApiModel):
    policy: Literal["latency-first", "cost-first", "adaptive"] = Field(
        "latency-first",
        description="policy is latency-first (spread, dedicated nodes, high priority, PDB), cost-first (pack, spot "
        "nodes, preemptible, scale to zero) or adaptive: the model moves between its spec.pool (cost-first) and "
        "dedicated latency-first replicas of its own, from its traffic and SLO (docs/autoscaling.md, \"Adaptive "
        "tiering\").",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="nodeSelector labels are added to the policy's node selector."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="tolerations are added to the policy's tolerations."
    )
    priority_class_name: str | None = Field(
        None, description="priorityClassName replaces the policy's priority class."
    )


class ColdStartSpec(ApiModel):
    max_held: int = Field(
        256,
        description="maxHeld is how many requests each flotilla-gateway replica holds for this model while it has no ready replica; more get 429.",
        ge=0,
        le=100000,
    )
    max_wait_seconds: int = Field(
        300,
        description="maxWaitSeconds is how long the gateway holds a request for a ready replica before answering 503.",
        ge=1,
        le=3600,
    )


class RoutingSpec(ApiModel):
    policy: Literal["least-load", "prefix"] | None = Field(
        None,
        description="policy is how flotilla-gateway picks a replica: least-load (fewest in-flight + waiting) or prefix (consistent hashing with bounded loads on the prompt's start); unset takes prefix for chat and least-load for completions.",
    )


class GatewaySpec(ApiModel):
    inference_pool: bool = Field(
        False,
        strict=True,  # a bool, never "yes": render reads specs the API server never saw
        description="inferencePool makes `flotilla-operator render` emit an InferencePool "
        "(inference.networking.k8s.io/v1) selecting the model's pods, so that any gateway implementing the Gateway "
        "API Inference Extension routes to them in place of flotilla-gateway; its endpoint picker is the Service "
        "`NAME-epp`, port 9002, which you deploy. The operator itself does not create it "
        "(docs/inference-gateway.md).",
    )


_CLASS_KEYS = "self.all(k, k in " + str(list(request_classes.REQUEST_CLASSES)) + ")"
PositiveNumber = Annotated[float, Field(gt=0)]
PositiveSeconds = Annotated[float, Field(gt=0, le=86400)]


def _check_class_keys(value: dict[str, float], where: str) -> dict[str, float]:
    unknown = sorted(set(value) - set(request_classes.REQUEST_CLASSES))
    if unknown:
        raise ValueError(f"server.classes.{where} names {', '.join(map(repr, unknown))}: the classes are "
                         f"{' and '.join(request_classes.REQUEST_CLASSES)}")
    return value


class ClassesSpec(ApiModel):
    """Request classes and tenants (docs/serving.md, "Priorities and tenants"): every field is optional."""

    weights: dict[str, PositiveNumber] = Field(
        dict(request_classes.DEFAULT_CLASS_WEIGHTS),  # pydantic copies it for each instance
        description="weights share admissions between the request classes while both wait (weighted fair "
        "queuing): `interactive` and `batch`, each > 0; a class left out keeps its default. Rendered as "
        "--class-weights when it differs from the default.",
        json_schema_extra={"maxProperties": len(request_classes.REQUEST_CLASSES), **rules(
            (_CLASS_KEYS, "server.classes.weights may name only interactive and batch"))},
    )
    interactive_reserve_slots: int | None = Field(
        None,
        description="interactiveReserveSlots is the slots only interactive requests may take, below "
        "maxNumSeqs; 0 turns the reserve off. Unset: the server's default, maxNumSeqs / 8, at least 1 (none with "
        "one slot). "
        "Rendered as --interactive-reserve-slots.",
        ge=0,
    )
    batch_max_preemptions: int = Field(
        request_classes.DEFAULT_BATCH_MAX_PREEMPTIONS,
        description="batchMaxPreemptions is how many times one batch request may give its slot to a waiting "
        "interactive one before it keeps it, so that batch work finishes. Rendered as --batch-max-preemptions "
        "when it differs from the default.",
        ge=0,
        le=100,
    )
    batch_prefill_tokens: int = Field(
        request_classes.DEFAULT_BATCH_PREFILL_TOKENS,
        description="batchPrefillTokens is the prefill tokens batch requests may take in one engine step while "
        "interactive work waits or prefills. Rendered as --batch-prefill-tokens when it differs from the default.",
        ge=0,
    )
    queue_timeout_seconds: dict[str, PositiveSeconds] = Field(
        default_factory=dict,
        description="queueTimeoutSeconds is a wait budget in the admission queue per class (e.g. `batch: 600`); "
        "a class left out waits server.queueTimeoutSeconds. Rendered as --class-queue-timeout-s.",
        json_schema_extra={"maxProperties": len(request_classes.REQUEST_CLASSES), **rules(
            (_CLASS_KEYS, "server.classes.queueTimeoutSeconds may name only interactive and batch"))},
    )
    tenant_weights: dict[str, PositiveNumber] = Field(
        default_factory=dict,
        description="tenantWeights share admissions between tenants (X-Flotilla-Tenant, else the OpenAI `user` "
        "field) within a class, each > 0; a tenant left out weighs 1. Setting it, or a tenant cap, turns tenant "
        "fairness on; else one class's requests are served first come, first served. Tenant names match "
        f"`{TENANT_NAME}`. Rendered as --tenant-weights.",
        json_schema_extra={"maxProperties": MAX_TENANTS},
    )
    tenant_max_running: int | None = Field(
        None,
        description="tenantMaxRunning is the requests one tenant may have running at once per replica; more "
        "wait. Unset: no cap. Rendered as --tenant-max-running.",
        ge=1,
    )
    tenant_max_queued: int | None = Field(
        None,
        description="tenantMaxQueued is the requests one tenant may have waiting per replica; more get 429 "
        "with reason tenant_limit and Retry-After. Unset: no cap. Rendered as --tenant-max-queued.",
        ge=1,
    )

    @field_validator("weights")
    @classmethod
    def _weights_name_classes(cls, value: dict[str, float]) -> dict[str, float]:
        return _check_class_keys(value, "weights")

    @field_validator("queue_timeout_seconds")
    @classmethod
    def _timeouts_name_classes(cls, value: dict[str, float]) -> dict[str, float]:
        return _check_class_keys(value, "queueTimeoutSeconds")

    @field_validator("tenant_weights")
    @classmethod
    def _tenant_names(cls, value: dict[str, float]) -> dict[str, float]:
        bad = sorted(name for name in value if not re.fullmatch(TENANT_NAME, name))
        if bad:
            raise ValueError(f"server.classes.tenantWeights: tenant names {', '.join(map(repr, bad))} do not "
                             f"match {TENANT_NAME} (no commas, `=` or spaces)")
        return value


class ServerSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.maxBatchedTokens >= self.prefillChunk",
                "server.maxBatchedTokens must be at least server.prefillChunk",
            ),
            (
                "self.maxBatchedTokens >= self.maxNumSeqs",
                "server.maxBatchedTokens must be at least server.maxNumSeqs (one decode token per running sequence)",
            ),
            (
                "self.blockSize in " + str(list(BLOCK_SIZES)),
                "server.blockSize must be a power of two between 1 and 256",
            ),
            (
                "!has(self.classes) || !has(self.classes.interactiveReserveSlots) "
                "|| self.classes.interactiveReserveSlots < self.maxNumSeqs",
                "server.classes.interactiveReserveSlots must be less than server.maxNumSeqs, or batch work never runs",
            ),
        )
    )

    max_num_seqs: int = Field(
        server_flags.DEFAULT_MAX_NUM_SEQS, description="maxNumSeqs is the slots: sequences running at once per replica.", ge=1, le=4096
    )
    max_batched_tokens: int = Field(
        server_flags.DEFAULT_MAX_NUM_BATCHED_TOKENS, description="maxBatchedTokens is the token budget of one engine step.", ge=1
    )
    prefill_chunk: int = Field(
        server_flags.DEFAULT_PREFILL_CHUNK, description="prefillChunk is the longest prefill piece of one sequence in one step.", ge=1
    )
    block_size: int = Field(
        server_flags.DEFAULT_BLOCK_SIZE, description="blockSize is the KV positions per cache block (a power of two).", ge=1, le=256
    )
    gpu_memory_utilization: float | None = Field(
        None,
        description="gpuMemoryUtilization is the share of one GPU's memory the server may use, as in vLLM: after the weights and one profiled step, the KV cache gets the rest. On a CPU pod it is the share of the container's memory limit, and the KV cache never exceeds every slot at maxModelLen. Unset: the server's default, 0.9.",
        gt=0,
        le=1,
    )
    kv_cache_memory_fraction: float | None = Field(
        None,
        description="kvCacheMemoryFraction is deprecated: use gpuMemoryUtilization (it is accepted for one release, with a Warning event). It is the share of memory given to the KV cache alone: of resources.gpuMemory per GPU, or of resources.memory on CPU. Ignored when gpuMemoryUtilization is set.",
        gt=0,
        le=1,
    )
    max_model_len: int | None = Field(None, description="maxModelLen caps the context length; unset takes the model's own, capped by what the KV cache holds for one sequence.", ge=1)
    queue_depth_per_slot: int = Field(
        server_flags.DEFAULT_QUEUE_DEPTH_PER_SLOT, description="queueDepthPerSlot bounds the admission queue at this many waiting requests per slot; at least 1, since every request waits in it, however briefly, before the engine admits it.", ge=1
    )
    queue_timeout_seconds: float = Field(
        server_flags.DEFAULT_QUEUE_TIMEOUT_S, description="queueTimeoutSeconds is how long a request may wait before it gets 429.", gt=0
    )
    drain_timeout_seconds: float = Field(
        server_flags.DEFAULT_DRAIN_TIMEOUT_S, description="drainTimeoutSeconds is how long in-flight requests may finish after SIGTERM.", ge=0, le=3600
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None, description="dtype of weights and KV cache. auto lets the server pick per model: on CPU float32 for "
        "weights held as gguf or int8 and for a mixture of experts, else bfloat16 where the CPU computes it natively (avx512_bf16 or AMX) and "
        "float32 where it would be emulated. Unset means bfloat16 on GPU and auto on CPU."
    )
    quantization: Literal["none", "gguf", "int8", "fp8"] | None = Field(
        None, description="quantization says how weights are held: gguf keeps a .gguf file's quantized blocks (Q8_0, "
        "Q5_0, Q5_1, Q4_0, Q4_1, Q2_K to Q6_K) as they are on CPU (about a sixth of float32's memory for a Q4_1 file); int8 quantizes any model's "
        "projections, embedding and head to per-channel int8 at load (CPU only; not a mixture of experts; about a quarter of float32's memory); "
        "fp8 quantizes any model's projections to e4m3 with per-channel scales at load (a GPU of compute capability "
        "8.9 or later: L4, L40S, H100, H200); none dequantizes every weight to dtype at load. Unset means gguf for a .gguf file and none otherwise (docs/models.md, \"Quantization\").",
    )
    api_key_secret_ref: ApiKeySecretRef | None = Field(
        None,
        description="apiKeySecretRef names a Secret key holding the API key the server then requires on /v1/... "
        "(Authorization: Bearer), set as the FLOTILLA_API_KEY environment variable from the Secret, so the key "
        "never shows in the pod spec. Give flotilla-gateway the same key (the chart's gateway.upstreamApiKeySecret).",
    )
    classes: ClassesSpec = Field(
        default_factory=ClassesSpec,
        description="classes sets how requests marked `interactive` (the default) or `batch` (X-Flotilla-Class, "
        "or the `flotilla_class` body field) and their tenants share each replica (docs/serving.md).",
    )
    max_loras: int | None = Field(
        None,
        description="maxLoras is how many LoRA adapters each replica holds in its slots at once (the others wait in "
        "host memory and are swapped in on use). Unset: the server's default, "
        f"{server_flags.DEFAULT_MAX_LORAS}. Rendered as --max-loras.",
        ge=1,
        le=MAX_ADAPTERS,
    )
    max_lora_rank: int | None = Field(
        None,
        description="maxLoraRank is the adapter slots' width: the highest LoRA rank served (an adapter of a higher "
        f"rank is refused). Unset: the server's default, {server_flags.DEFAULT_MAX_LORA_RANK}. Rendered as "
        "--max-lora-rank.",
        ge=1,
        le=server_flags.MAX_LORA_RANK_CAP,
    )
    extra_args: list[str] = Field(default_factory=list, description="extraArgs are appended to the server's command line.")


class NetworkPeer(ApiModel):
    namespace_labels: dict[str, str] = Field(
        default_factory=dict, description="namespaceLabels select the peer's namespaces; empty means every namespace."
    )
    pod_labels: dict[str, str] = Field(description="podLabels select the peer's pods in those namespaces.")


def _gateway_peer() -> NetworkPeer:  # the labels the chart puts on flotilla-gateway's pods
    return NetworkPeer(pod_labels={"app.kubernetes.io/part-of": "flotilla", "app.kubernetes.io/component": "gateway"})


def _prometheus_peer() -> NetworkPeer:  # the label the Prometheus operator puts on Prometheus's pods
    return NetworkPeer(pod_labels={"app.kubernetes.io/name": "prometheus"})


class NetworkPolicySpec(ApiModel):
    enabled: bool = Field(
        False, description="enabled renders a NetworkPolicy: the model's pods then accept traffic only from the gateway and Prometheus."
    )
    gateway: NetworkPeer = Field(default_factory=_gateway_peer, description="gateway selects flotilla-gateway's pods (default: the chart's labels).")
    prometheus: NetworkPeer = Field(default_factory=_prometheus_peer, description="prometheus selects the pods that scrape /metrics.")


class InferenceModelSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.placement.policy != 'latency-first' || self.scaling.minReplicas >= 1",
                "placement.policy latency-first requires scaling.minReplicas >= 1; use cost-first to scale to zero",
            ),
            (
                "!has(self.resources.gpuType) || self.resources.gpus > 0",
                "resources.gpuType needs resources.gpus > 0",
            ),
            (
                "!has(self.adapters) || self.adapters.all(a, a.name != self.model.name)",
                "adapters[].name must differ from model.name: a request names an adapter as its model",
            ),
            (
                "!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
                "adapters[].name must be unique within the model",
            ),
            (
                "self.placement.policy != 'adaptive' || has(self.pool)",
                "placement.policy adaptive needs spec.pool: the ModelPool it moves to and from",
            ),
            (
                "!has(self.tiering) || self.placement.policy == 'adaptive'",
                "tiering applies to placement.policy adaptive only; remove it or set the policy to adaptive",
            ),
            (
                "!has(self.slo) || !has(self.pool) || self.placement.policy != 'cost-first'",
                "slo needs the model's own Deployment: a cost-first model that names a pool is scaled by its "
                "ModelPool; remove slo or pool, or use latency-first",
            ),
        )
    )

    model: ModelSpec = Field(description="model names the served model and where its weights come from.")
    image: str | None = Field(
        None, description="image is the flotilla-server container image; unset takes the operator's --default-image."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="resources of each replica.")
    replicas: int = Field(
        1, description="replicas is the desired replica count; the autoscaler (or kubectl scale) writes it.", ge=0
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="scaling bounds and paces the autoscaler.")
    slo: SloSpec | None = Field(
        None,
        description="slo sets latency targets (time to first token, time per output token) that the autoscaler "
        "scales on beside queue depth, the larger recommendation winning (docs/autoscaling.md, \"SLO scaling\").",
    )
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="placement decides where replicas run.")
    server: ServerSpec = Field(default_factory=ServerSpec, description="server tunes flotilla-server in each replica.")
    cold_start: ColdStartSpec = Field(
        default_factory=ColdStartSpec, description="coldStart bounds the requests flotilla-gateway holds while the model scales from zero."
    )
    routing: RoutingSpec = Field(default_factory=RoutingSpec, description="routing sets how flotilla-gateway picks a replica.")
    gateway: GatewaySpec = Field(
        default_factory=GatewaySpec,
        description="gateway connects the model to gateways other than flotilla-gateway (docs/inference-gateway.md).",
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="networkPolicy limits who may reach the model's pods."
    )
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        description="adapters are LoRA adapters served on the model, each a name a request may send as `model` "
        "(docs/operator.md, \"Adapters\"). pvc adapters are listed in a ConfigMap the servers re-read, so adding or "
        "removing one restarts no pod once its claim is mounted; an image adapter, a new claim, or the first "
        "adapter (or the last removed) changes the pod template: a rolling restart. A pool member's adapters "
        "ride with it into the pool.",
        max_length=MAX_ADAPTERS,
    )
    pool: str | None = Field(
        None,
        description="pool names a ModelPool in the same namespace. A cost-first model joins it (no Deployment of its own; "
        "replicas and scaling then belong to the pool); a latency-first model keeps its own Deployment (docs/pools.md); "
        "an adaptive one is in it or on its own replicas, as its status.tier says.",
        pattern=DNS_SUBDOMAIN,
    )
    tiering: TieringSpec | None = Field(
        None,
        description="tiering tunes when an adaptive model moves between its pool and dedicated replicas; unset takes "
        "every default (docs/autoscaling.md, \"Adaptive tiering\").",
    )

    @model_validator(mode="after")
    def _adapter_names(self) -> InferenceModelSpec:
        """What the CEL rules on adapter names refuse, for specs that did not pass through the API server."""
        names = [adapter.name for adapter in self.adapters]
        if self.model.name in names:
            raise ValueError("adapters[].name must differ from model.name: a request names an adapter as its model")
        if len(set(names)) != len(names):
            raise ValueError("adapters[].name must be unique within the model")
        return self

    @model_validator(mode="after")
    def _adaptive_has_pool(self) -> InferenceModelSpec:
        """What the CEL rules on adaptive and tiering refuse, for specs that did not pass through the API server."""
        if self.placement.policy == "adaptive" and self.pool is None:
            raise ValueError("placement.policy adaptive needs spec.pool: the ModelPool it moves to and from")
        if self.tiering is not None and self.placement.policy != "adaptive":
            raise ValueError("tiering applies to placement.policy adaptive only; remove it or set the policy to adaptive")
        return self

    @model_validator(mode="after")
    def _slo_not_pooled(self) -> InferenceModelSpec:
        """What the CEL rule on slo and pool refuses, for specs that did not pass through the API server."""
        if self.slo is not None and self.pool is not None and self.placement.policy == "cost-first":
            raise ValueError("slo needs the model's own Deployment: a cost-first model that names a pool is scaled "
                             "by its ModelPool; remove slo or pool, or use latency-first")
        return self


class Condition(ApiModel):
    type: str = Field(description="type is Ready, Progressing, Degraded or ScalingActive.")
    status: Literal["True", "False", "Unknown"] = Field(description="status of the condition.")
    reason: str = Field(description="reason is a CamelCase word a program can match on.")
    message: str = Field("", description="message says what happened in plain words.")
    last_transition_time: str = Field(description="lastTransitionTime is when status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="observedGeneration is the spec generation it describes.")


class Recommendation(ApiModel):
    time: str = Field(description="time of the recommendation (RFC 3339).")
    replicas: int = Field(description="replicas the autoscaler recommended then.", ge=0)


class SloScalerStatus(ApiModel):
    recommendations: list[Recommendation] = Field(
        default_factory=list, description="recommendations of the SLO scaler within the scale-down window.")
    ready_replicas: int | None = Field(None, description="readyReplicas seen at the SLO scaler's last decision.")
    ready_grew_at: str | None = Field(
        None, description="readyGrewAt is when ready replicas last grew; the next scale-up waits one window after it.")
    scaled_down_at: str | None = Field(
        None, description="scaledDownAt is when the SLO scaler last shed replicas; the next waits one window after it.")


class SloStatus(ApiModel):
    ttft_seconds: float | None = Field(
        None, description="ttftSeconds is the measured TTFT at spec.slo.ttftPercentile over the window.")
    ttft_attainment: float | None = Field(
        None, description="ttftAttainment is the share of the window's requests whose TTFT was within "
        "spec.slo.ttftSeconds, read from the histogram's buckets.")
    tpot_seconds: float | None = Field(
        None, description="tpotSeconds is the measured inter-token gap at spec.slo.tpotPercentile over the window.")
    tpot_attainment: float | None = Field(
        None, description="tpotAttainment is the share of the window's output tokens that came within "
        "spec.slo.tpotSeconds of the one before.")
    requests: float | None = Field(None, description="requests is how many first tokens the window holds.")
    window_seconds: int | None = Field(None, description="windowSeconds is the window the figures cover.")
    signal: float | None = Field(
        None, description="signal is the worse of measured over target for TTFT and TPOT (1: exactly on target).")
    observed_at: str | None = Field(None, description="observedAt is when the figures were read (RFC 3339).")


class AutoscalerStatus(ApiModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    last_scale_time: str | None = Field(None, description="lastScaleTime is when the autoscaler last changed replicas.")
    last_decision: str | None = Field(None, description="lastDecision is the last decision with the numbers that drove it.")
    last_reason: str | None = Field(None, description="lastReason is the machine-readable reason of the last decision.")
    queue_depth: int | None = Field(None, description="queueDepth is the pool-wide waiting requests seen at the last decision.")
    idle_since: str | None = Field(None, description="idleSince is when demand was last seen to drop to zero (for scale to zero).")
    recommendations: list[Recommendation] = Field(
        default_factory=list, description="recommendations within the stabilization window; they survive operator restarts."
    )


class ModelAutoscalerStatus(AutoscalerStatus):
    """An InferenceModel's autoscaler status: a ModelPool's, plus the SLO scaler's memory."""

    slo: SloScalerStatus | None = Field(
        None, description="slo is the SLO scaler's memory, when spec.slo is set; it survives operator restarts too.")


class AdapterStatus(ApiModel):
    name: str = Field(description="name is the adapter (spec.adapters[].name).")
    pods: int = Field(description="pods is how many ready pods serve the adapter now, as their load reports say.", ge=0)
    resident: int = Field(0, description="resident is how many of them hold it in an adapter slot now.", ge=0)


class InferenceModelStatus(ApiModel):
    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "ScaledToZero"] | None = Field(
        None, description="phase summarises the conditions in one word."
    )
    message: str | None = Field(
        None, description="message says in one short line why the phase is what it is (e.g. `2/4 pods: ImagePullBackOff ...`)."
    )
    replicas: int | None = Field(None, description="replicas the Deployment runs now (the scale subresource reads it).")
    ready_replicas: int | None = Field(None, description="readyReplicas are replicas passing their readiness probe.")
    desired_replicas: int | None = Field(None, description="desiredReplicas is spec.replicas clamped to the scaling bounds.")
    observed_generation: int | None = Field(None, description="observedGeneration is the spec generation last reconciled.")
    endpoint: str | None = Field(None, description="endpoint is the in-cluster URL of the OpenAI API.")
    selector: str | None = Field(None, description="selector is the pods' label selector (for the scale subresource).")
    conditions: list[Condition] = Field(default_factory=list, description="conditions: Ready, Progressing, Degraded, ScalingActive.")
    autoscaler: ModelAutoscalerStatus | None = Field(None, description="autoscaler is written by the autoscaler only.")
    slo: SloStatus | None = Field(
        None, description="slo is the latency measured against spec.slo over its window, at the last decision.")
    pool: str | None = Field(None, description="pool is the ModelPool serving this model, when it joined one.")
    tier: Literal["pool", "dedicated"] | None = Field(
        None, description="tier is where an adaptive model is served: its pool, or dedicated replicas (during a move, "
        "the tier it is leaving).")
    tier_since: str | None = Field(None, description="tierSince is when the model entered its tier, or last tried to leave it.")
    move: MoveStatus | None = Field(None, description="move is the tier move in flight; absent when none is.")
    tiering: TieringStatus | None = Field(None, description="tiering is the adaptive tier decision's last reading.")
    resident_pods: list[str] = Field(
        default_factory=list, description="residentPods are the pool pods holding this model loaded now (pooled models only)."
    )
    adapters: list[AdapterStatus] = Field(
        default_factory=list, description="adapters says, for each of spec.adapters, how many ready pods serve it."
    )


def parse_spec(spec: dict[str, Any]) -> InferenceModelSpec:
    """The typed spec of a stored object (defaults filled in for fields the API server did not default)."""
    return InferenceModelSpec.model_validate(spec)
