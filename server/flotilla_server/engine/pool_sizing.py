"""How many KV blocks the pool gets, and the context limit that follows: a pure function of memory facts.

Rules (docs/serving.md, "KV cache"):

- `--num-kv-blocks`, else `--kv-cache-memory`, else a share of memory: `--gpu-memory-utilization` × the
  device's memory (CPU: the container's memory limit, or the memory available) less the weights and, on a
  GPU, less the peak of one profiled step and what other processes hold.
- On CPU with no memory limit (or one above MemAvailable) the pool also never exceeds a quarter of
  MemAvailable, nor 1 GiB (`SHARED_HOST_KV_SHARE`, `SHARED_HOST_KV_MAX_BYTES`): that memory is the host's,
  shared with every program on it, and two servers started at once both read the same MemAvailable. Each
  taking at most a quarter, two servers' pools together stay within half of it, whether they start at once
  or one after the other; `--kv-cache-memory` takes more.
- On CPU the pool never exceeds every slot at the context limit (`max_num_seqs × max_model_len`): memory a
  host shares with its other programs is not taken for positions no request can use.
- `max_model_len` defaults to the model's context, capped by what the pool holds for one sequence; a
  `--max-model-len` whose one sequence does not fit is refused, naming the flags to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from flotilla_contract.flags import SHARED_HOST_KV_MAX_BYTES, SHARED_HOST_KV_SHARE

from flotilla_server.engine.feasibility import blocks_for

GIB = 1024**3
SHARE_SOURCE = "--gpu-memory-utilization"
SHARED_HOST_SOURCE = (f"no memory limit: at most {SHARED_HOST_KV_SHARE:.0%} of MemAvailable and "
                      f"{SHARED_HOST_KV_MAX_BYTES / GIB:g} GiB; --kv-cache-memory raises it")
SLOTS_SOURCE = "--max-num-seqs × --max-model-len"


@dataclass(frozen=True)
class MemoryFacts:
    """What sizing needs to know of the machine; measured by the engine core, invented by tests."""

    on_gpu: bool
    capacity_bytes: int  # GPU: the device's total memory; CPU: the cgroup's memory.max, or MemAvailable
    weights_bytes: int  # the model's parameters and, on CPU, their packed copies (engine/memory_facts.weights_bytes)
    activation_bytes: int = 0  # GPU: the peak of one profiled step at max_num_batched_tokens
    others_bytes: int = 0  # GPU: memory held outside this engine's tensors (other processes, the CUDA context)
    capacity_is_limit: bool = False  # CPU: capacity_bytes is the container's own limit, not the host's MemAvailable


@dataclass(frozen=True)
class PoolPlan:
    num_blocks: int
    max_model_len: int
    source: str  # which rule sized it: "--num-kv-blocks", "--kv-cache-memory", or the bound of the default

    def describe(self, block_size: int, bytes_per_block: int) -> str:
        tokens = self.num_blocks * block_size
        return (f"KV pool: {self.num_blocks} blocks = {tokens} tokens ({self.num_blocks * bytes_per_block / GIB:.2f} GiB, "
                f"sized by {self.source}); {tokens / self.max_model_len:.2f} sequences at the full "
                f"--max-model-len of {self.max_model_len} tokens")


def plan_pool(*, num_kv_blocks: int | None, kv_cache_memory_bytes: int | None, gpu_memory_utilization: float,
              max_num_seqs: int, block_size: int, requested_max_model_len: int | None, model_context: int,
              bytes_per_block: int, facts: MemoryFacts) -> PoolPlan:
    """Raises ValueError, naming the flag to change, when not even one full-length sequence fits."""
    if requested_max_model_len is not None and not 0 < requested_max_model_len <= model_context:
        raise ValueError(f"--max-model-len {requested_max_model_len} is outside the model's context of "
                         f"1..{model_context} tokens; lower it or leave it unset")  # never silently cut
    wanted_len = requested_max_model_len or model_context
    if num_kv_blocks is not None:
        blocks, source = num_kv_blocks, "--num-kv-blocks"
    elif kv_cache_memory_bytes is not None:
        blocks, source = kv_cache_memory_bytes // bytes_per_block, "--kv-cache-memory"
    else:
        blocks, source = default_blocks(gpu_memory_utilization, facts, bytes_per_block)
        slot_blocks = max_num_seqs * blocks_for(wanted_len, block_size)
        if not facts.on_gpu and slot_blocks < blocks:
            blocks, source = slot_blocks, SLOTS_SOURCE
    if blocks < 1:
        raise ValueError(f"{source} gives less than one KV block ({bytes_per_block} bytes); give the KV cache more")
    explicit = source in ("--num-kv-blocks", "--kv-cache-memory")
    if explicit and facts.capacity_bytes and blocks * bytes_per_block > facts.capacity_bytes:
        raise ValueError(f"{source}: a KV cache of {blocks * bytes_per_block} bytes is more than the "
                         f"{facts.capacity_bytes} bytes of memory this engine may use; lower {source}")
    held = blocks * block_size
    if requested_max_model_len is not None and blocks_for(wanted_len, block_size) > blocks:
        raise ValueError(
            f"--max-model-len {wanted_len} does not fit: the KV pool ({source}) holds {held} tokens, not even one "
            f"sequence of {wanted_len}; lower --max-model-len or give the KV cache more memory "
            "(--gpu-memory-utilization, --kv-cache-memory or --num-kv-blocks)"
        )
    return PoolPlan(blocks, min(wanted_len, held), source)


def shared_host_cap_bytes(facts: MemoryFacts) -> int | None:
    """CPU with no binding memory limit: the most of the host's memory the default pool may take; else None."""
    if facts.on_gpu or facts.capacity_is_limit:
        return None
    return min(int(SHARED_HOST_KV_SHARE * facts.capacity_bytes), SHARED_HOST_KV_MAX_BYTES)


def default_blocks(gpu_memory_utilization: float, facts: MemoryFacts, bytes_per_block: int) -> tuple[int, str]:
    """The pool no flag sized, in blocks, and which rule bound it. Raises ValueError when it is empty."""
    budget = int(gpu_memory_utilization * facts.capacity_bytes) - facts.weights_bytes
    budget -= facts.activation_bytes + facts.others_bytes
    source = SHARE_SOURCE
    cap = shared_host_cap_bytes(facts)
    if cap is not None and cap < budget:
        budget, source = cap, SHARED_HOST_SOURCE
    blocks = max(0, budget) // bytes_per_block
    if blocks < 1:
        raise ValueError(
            f"no memory is left for the KV cache: {gpu_memory_utilization} × {facts.capacity_bytes / GIB:.2f} GiB "
            f"less {facts.weights_bytes / GIB:.2f} GiB of weights"
            + (f", {facts.activation_bytes / GIB:.2f} GiB of activations and {facts.others_bytes / GIB:.2f} GiB "
               "held by others" if facts.on_gpu else "")
            + (f" (with no memory limit, at most {SHARED_HOST_KV_SHARE:.0%} of MemAvailable)" if cap is not None else "")
            + " leaves nothing; raise --gpu-memory-utilization, give the container more memory, or set "
            "--kv-cache-memory"
        )
    return blocks, source
