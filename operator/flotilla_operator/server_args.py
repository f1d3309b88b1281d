"""Render `spec.server` (and the model) into flotilla-server's command-line flags (issue 3's contract)."""

from __future__ import annotations

import math
import re

from flotilla_operator.types import InferenceModelSpec

PORT = 8000
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(text: str) -> int:
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as 8Gi or 512Mi")
    return int(float(match.group(1)) * _FACTOR[match.group(2)])


def device(spec: InferenceModelSpec) -> str:
    return "cuda" if spec.resources.gpus > 0 else "cpu"


def dtype(spec: InferenceModelSpec) -> str:
    return spec.server.dtype or ("bfloat16" if spec.resources.gpus > 0 else "float32")


def kv_cache_bytes(spec: InferenceModelSpec) -> int | None:
    """kvCacheMemoryFraction of one GPU's memory (GPU pods) or of the container's memory (CPU pods)."""
    fraction = spec.server.kv_cache_memory_fraction
    if fraction is None:
        return None
    if spec.resources.gpus > 0:
        if spec.resources.gpu_memory is None:
            return None  # the operator cannot know the GPU's size: the server sizes the pool itself
        return math.floor(fraction * quantity_bytes(spec.resources.gpu_memory))
    return math.floor(fraction * quantity_bytes(spec.resources.memory))


def render_server_args(spec: InferenceModelSpec, model_arg: str) -> list[str]:
    server = spec.server
    args = [
        "--model", model_arg,
        "--served-model-name", spec.model.name,
        "--host", "0.0.0.0",
        "--port", str(PORT),
        "--max-num-seqs", str(server.max_num_seqs),
        "--max-num-batched-tokens", str(server.max_batched_tokens),
        "--prefill-chunk", str(server.prefill_chunk),
        "--block-size", str(server.block_size),
        "--queue-depth-per-slot", str(server.queue_depth_per_slot),
        "--queue-timeout-s", f"{server.queue_timeout_seconds:g}",
        "--drain-timeout-s", f"{server.drain_timeout_seconds:g}",
        "--dtype", dtype(spec),
        "--device", device(spec),
    ]
    if (kv_bytes := kv_cache_bytes(spec)) is not None:
        args += ["--kv-cache-memory", str(kv_bytes)]
    if server.max_model_len is not None:
        args += ["--max-model-len", str(server.max_model_len)]
    return args + list(server.extra_args)
