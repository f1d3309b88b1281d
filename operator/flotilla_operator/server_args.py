"""Render `spec.server` (and the model) into flotilla-server's command-line flags.

Flag names and defaults come from the contract's flag table (flotilla_contract.flags), the same table
the server parses, so the two programs cannot drift apart (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import math

from flotilla_contract import classes as request_classes
from flotilla_contract.flags import DEFAULT_PORT, FLAGS_BY_NAME
from flotilla_contract.sizes import parse_bytes

from flotilla_operator.types import InferenceModelSpec, ServerSpec

PORT = DEFAULT_PORT


def device(spec: InferenceModelSpec) -> str:
    return "cuda" if spec.resources.gpus > 0 else "cpu"


def server_dtype(server: ServerSpec, gpus: int) -> str:
    """`--dtype` of a model's or a pool's pods: spec.server.dtype, or unset bfloat16 on a GPU and `auto` on CPU
    (the server picks bfloat16 where the CPU computes it, else float32: docs/serving.md, "dtype")."""
    return server.dtype or ("bfloat16" if gpus > 0 else "auto")


def kv_cache_bytes(spec: InferenceModelSpec) -> int | None:
    """The deprecated kvCacheMemoryFraction, kept for one release: that share of one GPU's memory (GPU pods)
    or of the container's memory (CPU pods), as `--kv-cache-memory`; gpuMemoryUtilization replaces it."""
    fraction = spec.server.kv_cache_memory_fraction
    if fraction is None or spec.server.gpu_memory_utilization is not None:
        return None
    if spec.resources.gpus > 0:
        if spec.resources.gpu_memory is None:
            return None  # the operator cannot know the GPU's size: the server sizes the pool itself
        return math.floor(fraction * parse_bytes(spec.resources.gpu_memory))
    return math.floor(fraction * parse_bytes(spec.resources.memory))


def flag(name: str, value: object) -> list[str]:
    """One flag and its value; the name must be in the server's flag table (a KeyError is a bug here)."""
    rendered = f"{value:g}" if isinstance(value, float) else str(value)
    return [FLAGS_BY_NAME[name].flag, rendered]


def name_values(values: dict[str, float]) -> str:
    """`{"interactive": 8.0, "batch": 1.0}` → `interactive=8,batch=1`, the server's NAME=VALUE list (12
    significant digits: `:g` alone would round a weight of 1234567 to 1.23457e+06)."""
    return ",".join(f"{name}={value:.12g}" for name, value in values.items())


def class_values(server: ServerSpec) -> list[tuple[str, object]]:
    """spec.server.classes as (flag, value) pairs: only what differs from the server's own defaults, so that
    a spec that leaves classes alone renders the arguments it rendered before (no rollout on an operator
    upgrade, and a pinned older server image never meets a flag it does not know)."""
    classes = server.classes
    order = {name: i for i, name in enumerate(request_classes.REQUEST_CLASSES)}
    values: list[tuple[str, object]] = []
    weights = {**request_classes.DEFAULT_CLASS_WEIGHTS, **classes.weights}  # a class left out keeps its default
    if weights != request_classes.DEFAULT_CLASS_WEIGHTS:
        values.append(("--class-weights", name_values(dict(sorted(weights.items(), key=lambda kv: order[kv[0]])))))
    if classes.interactive_reserve_slots is not None:
        values.append(("--interactive-reserve-slots", classes.interactive_reserve_slots))
    if classes.queue_timeout_seconds:
        timeouts = dict(sorted(classes.queue_timeout_seconds.items(), key=lambda kv: order[kv[0]]))
        values.append(("--class-queue-timeout-s", name_values(timeouts)))
    if classes.batch_max_preemptions != request_classes.DEFAULT_BATCH_MAX_PREEMPTIONS:
        values.append(("--batch-max-preemptions", classes.batch_max_preemptions))
    if classes.batch_prefill_tokens != request_classes.DEFAULT_BATCH_PREFILL_TOKENS:
        values.append(("--batch-prefill-tokens", classes.batch_prefill_tokens))
    if classes.tenant_weights:
        values.append(("--tenant-weights", name_values(dict(sorted(classes.tenant_weights.items())))))
    if classes.tenant_max_running is not None:
        values.append(("--tenant-max-running", classes.tenant_max_running))
    if classes.tenant_max_queued is not None:
        values.append(("--tenant-max-queued", classes.tenant_max_queued))
    return values


def lora_values(server: ServerSpec) -> list[tuple[str, object]]:
    """spec.server's adapter slots, only where set (a spec that leaves them alone renders what it did before)."""
    values: list[tuple[str, object]] = []
    if server.max_loras is not None:
        values.append(("--max-loras", server.max_loras))
    if server.max_lora_rank is not None:
        values.append(("--max-lora-rank", server.max_lora_rank))
    return values


def render_server_args(spec: InferenceModelSpec, model_arg: str, extra: list[str] | None = None) -> list[str]:
    """The server's flags; `extra` (rendered flags, e.g. the adapter list file's) go before spec.server.extraArgs."""
    server = spec.server
    values: list[tuple[str, object]] = [
        ("--model", model_arg),
        ("--served-model-name", spec.model.name),
        ("--host", "0.0.0.0"),
        ("--port", PORT),
        ("--max-num-seqs", server.max_num_seqs),
        ("--max-num-batched-tokens", server.max_batched_tokens),
        ("--prefill-chunk", server.prefill_chunk),
        ("--block-size", server.block_size),
        ("--queue-depth-per-slot", server.queue_depth_per_slot),
        ("--queue-timeout-s", float(server.queue_timeout_seconds)),
        ("--drain-timeout-s", float(server.drain_timeout_seconds)),
        ("--dtype", server_dtype(spec.server, spec.resources.gpus)),
        ("--device", device(spec)),
    ]
    if server.quantization is not None:
        values.append(("--quantization", server.quantization))
    if server.gpu_memory_utilization is not None:
        values.append(("--gpu-memory-utilization", server.gpu_memory_utilization))
    if (kv_bytes := kv_cache_bytes(spec)) is not None:
        values.append(("--kv-cache-memory", kv_bytes))
    if server.max_model_len is not None:
        values.append(("--max-model-len", server.max_model_len))
    values += class_values(server)
    values += lora_values(server)
    args = [part for name, value in values for part in flag(name, value)]
    return args + list(extra or []) + list(server.extra_args)
