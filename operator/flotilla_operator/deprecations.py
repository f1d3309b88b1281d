"""Deprecated spec fields still accepted: what each stored object uses, as one message to show (pure).

A deprecated field keeps working for one release, so that stored objects do not turn Degraded; the
operator says so once per object, as a Warning event, and in its `Deprecated` condition (status.py).
"""

from __future__ import annotations

from flotilla_operator.types import InferenceModelSpec


def deprecations(spec: InferenceModelSpec) -> list[str]:
    found = []
    if spec.server.kv_cache_memory_fraction is not None:
        if spec.server.gpu_memory_utilization is not None:
            found.append("spec.server.kvCacheMemoryFraction is deprecated and ignored beside "
                         "spec.server.gpuMemoryUtilization: remove it")
        else:
            found.append("spec.server.kvCacheMemoryFraction is deprecated: it is still rendered as "
                         "--kv-cache-memory for this release; replace it with spec.server.gpuMemoryUtilization "
                         "(the share of the GPU, or of a CPU pod's memory limit, the server may use)")
    return found
