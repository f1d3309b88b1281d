"""The ModelPool API (flotilla.dev/v1alpha1): one Deployment of multi-model servers shared by many models.

A ModelPool is the cost-first tier of docs/pools.md: cost-first InferenceModels that name it in
`spec.pool` are loaded and unloaded on demand by the pool's servers (an LRU model cache inside one
memory budget) instead of each getting a Deployment. The kind is `ModelPool`, not `InferencePool`:
the Gateway API Inference Extension's InferencePool is a set of endpoints serving one base model for
a gateway to pick from, while this is a set of servers holding *many* models, loaded by demand.

Like types.py, these pydantic models are the single source of truth for the CRD and docs/operator.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from flotilla_operator.types import (
    QUANTITY,
    ApiModel,
    AutoscalerStatus,
    Condition,
    PlacementSpec,
    ResourcesSpec,
    ServerSpec,
    rules,
)

KIND = "ModelPool"
PLURAL = "modelpools"
SINGULAR = "modelpool"
SHORT_NAMES = ("mp",)


class PoolVolume(ApiModel):
    claim_name: str = Field(
        description="claimName is the PersistentVolumeClaim, mounted read-only at /models in every pool pod, "
        "that holds the members' weights (members with a `pvc` source must name this claim).",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    )


class PoolScalingSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=rules(
        ("self.minReplicas <= self.maxReplicas", "scaling.minReplicas must not exceed scaling.maxReplicas"),
    ))

    min_replicas: int = Field(0, description="minReplicas is the floor of the pool's autoscaler; 0 allows scale to zero.", ge=0)
    max_replicas: int = Field(4, description="maxReplicas is the ceiling of the pool's autoscaler.", ge=1, le=1000)
    target_queue_depth: int = Field(
        8, description="targetQueueDepth is the waiting requests per replica the pool tolerates (over all its models).", ge=0
    )
    demand_window_seconds: int = Field(
        300,
        description="demandWindowSeconds is the window in which a member with requests counts as active: "
        "the pool never runs fewer replicas than the active members' memory needs (docs/pools.md).",
        ge=10,
        le=86400,
    )
    scale_up_stabilization_seconds: int = Field(
        0, description="scaleUpStabilizationSeconds is how long a higher recommendation must hold before scaling up.", ge=0, le=3600
    )
    scale_down_stabilization_seconds: int = Field(
        300, description="scaleDownStabilizationSeconds is the window whose highest recommendation a scale-down may not go under.",
        ge=0, le=86400,
    )
    scale_to_zero_after_seconds: int = Field(
        600, description="scaleToZeroAfterSeconds is the idle time of every member before a pool with minReplicas 0 scales to zero.", ge=0
    )
    disabled: bool = Field(False, description="disabled hands `.spec.replicas` to someone else (kubectl scale, an HPA, KEDA).")
    batch_demand_weight: float = Field(
        0.0,
        description="batchDemandWeight is how much one `batch` request (waiting or running, over every member) "
        "counts toward the pool's demand, an interactive one counting 1: 0 (the default) never scales the pool "
        "out for batch work; the memory floor still counts a member with only batch requests as active.",
        ge=0,
        le=1,
    )


class PoolPlacementSpec(PlacementSpec):
    policy: Literal["latency-first", "cost-first"] = Field(
        "cost-first",
        description="policy is cost-first (pack, spot nodes, preemptible, scale to zero; the pool's default) or "
        "latency-first (spread, dedicated nodes, high priority, a PodDisruptionBudget).",
    )


class ModelPoolSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=rules(
        ("!has(self.resources.gpuType) || self.resources.gpus > 0", "resources.gpuType needs resources.gpus > 0"),
        ("self.resources.gpus == 0 || has(self.memoryBudget) || has(self.resources.gpuMemory)",
         "a GPU pool needs memoryBudget or resources.gpuMemory: the servers' budget and the autoscaler's memory "
         "floor are sized from it"),
        ("!has(self.server.kvCacheMemoryFraction)",
         "server.kvCacheMemoryFraction does not apply to a pool: each member gets a KV pool of fixed size inside "
         "memoryBudget; remove it, or set modelMemory"),
    ))

    image: str | None = Field(
        None, description="image is the flotilla-server container image; unset takes the operator's --default-image."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="resources is the GPU shape of each replica.")
    memory_budget: str | None = Field(
        None,
        description="memoryBudget is the memory each replica's loaded models (weights and KV pools) may hold, a quantity; "
        "unset takes 80% of resources.gpuMemory (one GPU) or, on CPU, 50% of resources.memory; rendered as --memory-budget.",
        pattern=QUANTITY,
    )
    model_memory: str = Field(
        "2Gi",
        description="modelMemory is the memory one member is expected to hold when loaded (a quantity); the autoscaler's "
        "floor counts it until a server reports the member's real footprint.",
        pattern=QUANTITY,
    )
    volume: PoolVolume | None = Field(
        None, description="volume is the shared volume holding members' weights; members with a `pvc` source must use it."
    )
    replicas: int = Field(1, description="replicas is the desired replica count; the pool's autoscaler (or kubectl scale) writes it.", ge=0)
    scaling: PoolScalingSpec = Field(default_factory=PoolScalingSpec, description="scaling bounds and paces the pool's autoscaler.")
    placement: PoolPlacementSpec = Field(
        default_factory=PoolPlacementSpec,
        description="placement decides where replicas run and whether the pool gets a PodDisruptionBudget (latency-first).",
    )
    server: ServerSpec = Field(default_factory=ServerSpec, description="server tunes flotilla-server in each replica.")


class PoolMemberStatus(ApiModel):
    name: str = Field(description="name is the InferenceModel.")
    model: str = Field(description="model is the served model name.")
    source: str = Field(description="source is where the pool's servers load it from (`tiny`, or a path under /models).")


class ModelPoolStatus(ApiModel):
    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "ScaledToZero"] | None = Field(
        None, description="phase summarises the conditions in one word."
    )
    replicas: int | None = Field(None, description="replicas the Deployment runs now (the scale subresource reads it).")
    ready_replicas: int | None = Field(None, description="readyReplicas are replicas passing their readiness probe.")
    desired_replicas: int | None = Field(None, description="desiredReplicas is spec.replicas clamped to the scaling bounds.")
    observed_generation: int | None = Field(None, description="observedGeneration is the spec generation last reconciled.")
    endpoint: str | None = Field(None, description="endpoint is the in-cluster URL of the pool's OpenAI API (every member's name works).")
    selector: str | None = Field(None, description="selector is the pods' label selector (for the scale subresource).")
    member_count: int | None = Field(None, description="memberCount is the number of InferenceModels served by the pool.")
    members: list[PoolMemberStatus] = Field(default_factory=list, description="members are the InferenceModels the pool serves.")
    resident_count: int | None = Field(
        None, description="residentCount is the number of (pod, model) pairs loaded now, as the servers report them."
    )
    conditions: list[Condition] = Field(default_factory=list, description="conditions: Ready, Progressing, Degraded, ScalingActive.")
    autoscaler: AutoscalerStatus | None = Field(None, description="autoscaler is written by the pool's autoscaler only.")


def parse_pool_spec(spec: dict[str, Any]) -> ModelPoolSpec:
    """The typed spec of a stored ModelPool (defaults filled in for fields the API server did not default)."""
    return ModelPoolSpec.model_validate(spec)
