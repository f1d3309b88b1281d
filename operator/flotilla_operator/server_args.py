"""Render `spec.server` (and the model) into flotilla-server's command-line flags.

Flag names and defaults come from the contract's flag table (flotilla_contract.flags), the same table
the server parses, so the two programs cannot drift apart (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import math

from flotilla_contract.flags import DEFAULT_PORT, FLAGS_BY_NAME
from flotilla_contract.sizes import parse_bytes

from flotilla_operator.types import InferenceModelSpec

PORT = DEFAULT_PORT


def device(spec: InferenceModelSpec) -> str:
    return "cuda" if spec.resources.gpus > 0 else "cpu"


def dtype(spec: InferenceModelSpec) -> str:
    return spec.server.dtype or ("bfloat16" if spec.resources.gpus > 0 else "float32")


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


def render_server_args(spec: InferenceModelSpec, model_arg: str) -> list[str]:
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
        ("--dtype", dtype(spec)),
        ("--device", device(spec)),
    ]
    if server.gpu_memory_utilization is not None:
        values.append(("--gpu-memory-utilization", server.gpu_memory_utilization))
    if (kv_bytes := kv_cache_bytes(spec)) is not None:
        values.append(("--kv-cache-memory", kv_bytes))
    if server.max_model_len is not None:
        values.append(("--max-model-len", server.max_model_len))
    args = [part for name, value in values for part in flag(name, value)]
    return args + list(server.extra_args)
