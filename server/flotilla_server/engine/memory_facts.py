"""Measure what pool sizing needs (engine/pool_sizing.MemoryFacts): host memory from the cgroup and
/proc/meminfo, and on a GPU the peak of one profiled step.

On CPU the capacity is the container's limit (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`) when
it is below the memory available, else MemAvailable: a pod with an 8 Gi limit on a large node must not size
its pool from the node. It is read before the weights load, so the weights are subtracted once. Whether
the capacity is the container's own limit or the host's MemAvailable is reported too: only the latter is
shared with the host's other programs, and pool sizing takes a smaller share of it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flotilla_server.engine.feasibility import blocks_for
from flotilla_server.model import AttentionBatch, DecoderModel, KVCacheTensors

_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
_UNLIMITED = 1 << 60  # cgroup v1 writes a huge number for "no limit"


def cgroup_limit_bytes(paths: tuple[Path, ...] = _CGROUP_LIMITS) -> int | None:
    for path in paths:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text != "max" and text.isdigit() and int(text) < _UNLIMITED:
            return int(text)
    return None


def mem_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no MemAvailable in {meminfo}: set --kv-cache-memory")


def host_capacity() -> tuple[int, bool]:
    """(bytes this engine may use, whether that is the cgroup's limit); a limit above MemAvailable does not bind."""
    available = mem_available_bytes()
    limit = cgroup_limit_bytes()
    if limit is not None and limit <= available:
        return limit, True
    return available, False


def weights_bytes(model: torch.nn.Module) -> int:
    """The parameters, and on CPU the packed copies of them that the matmuls keep (as large again for every
    projection: a float32 or bfloat16 model holds about twice its parameters)."""
    if isinstance(model, DecoderModel):
        return model.weight_bytes()
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.inference_mode()
def profile_step_bytes(model: DecoderModel, num_tokens: int, max_rows: int, block_size: int,
                       kv_shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> int:
    """GPU: the peak memory of one prefill of `num_tokens` tokens plus `max_rows` logits rows, beyond
    what was allocated before it (a throwaway pool just large enough is not counted)."""
    num_layers, kv_heads, head_dim = kv_shape
    nb = blocks_for(num_tokens, block_size)
    kv = KVCacheTensors.allocate(num_layers, nb, block_size, kv_heads, head_dim, dtype, device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    batch = AttentionBatch.build([num_tokens], [num_tokens], [list(range(nb))], block_size, device)
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    pos = torch.arange(num_tokens, dtype=torch.long, device=device)
    hidden = model(ids, pos, batch, kv)
    model.compute_logits(hidden[-min(max_rows, num_tokens):])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del kv, hidden, batch
    torch.cuda.empty_cache()
    return peak
