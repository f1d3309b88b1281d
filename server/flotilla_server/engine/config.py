"""Engine configuration: one dataclass whose invariants are checked once, at construction.

Torch-free: the defaults are the contract's (flotilla_contract.flags), the one table the server's flags
and the operator's rendered arguments share (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from dataclasses import dataclass

from flotilla_contract.classes import DEFAULT_BATCH_MAX_PREEMPTIONS, DEFAULT_BATCH_PREFILL_TOKENS
from flotilla_contract.flags import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_LORA_RANK,
    DEFAULT_MAX_LORAS,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_SPECULATIVE_TOKENS,
    DTYPE_CHOICES,
    MAX_LORA_RANK_CAP,
    MAX_SPECULATIVE_TOKENS,
    MIN_SPECULATIVE_TOKENS,
    QUANTIZATIONS,
    SPECULATIVE_METHODS,
)


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"  # a Hugging Face directory, or "tiny" (the embedded demonstration model)
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # slots: sequences running at once
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # token budget of one step
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK  # longest prefill piece of one sequence in one step
    block_size: int = DEFAULT_BLOCK_SIZE  # KV positions per block
    num_kv_blocks: int | None = None  # pool size in blocks; None sizes it from kv_cache_memory_bytes
    kv_cache_memory_bytes: int | None = None  # pool size in bytes; None: sized from gpu_memory_utilization
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION  # share of device (CPU: container) memory
    max_model_len: int | None = None  # context limit; None: the model's, capped by what the pool holds
    dtype: str = "float32"  # or "auto": chosen per model at load (model/dtype_choice.py)
    quantization: str | None = None  # how weights are held (flags.QUANTIZATIONS); None: by the source's kind
    device: str = "cpu"
    seed: int | None = None  # unseeded requests' sampling seed; None: a random one per process
    enable_prefix_caching: bool = True  # reuse the KV blocks of prompts' common prefixes
    # request classes (engine/class_rules.py)
    interactive_reserve_slots: int = 0  # slots batch work never takes
    batch_max_preemptions: int = DEFAULT_BATCH_MAX_PREEMPTIONS  # slot preemptions of one batch request
    batch_prefill_tokens: int = DEFAULT_BATCH_PREFILL_TOKENS  # batch prefill per step while interactive waits
    batch_share_slots: int = 0  # slots batch work keeps against interactive arrivals (its weighted share)
    # CPU threads of a step of few sequences (engine/step_threads.py); None: every CPU the process may use; 0: off
    small_step_threads: int | None = None
    # replay pure decode steps from captured graphs (engine/decode_graphs.py): CUDA graphs on a GPU; on
    # CPU the same static-shape path runs eagerly (no gain: for tests of the mechanism)
    cuda_graphs: bool = False
    # LoRA adapters served on the model (engine/adapter_cache.py): (name, PEFT directory) pairs, read into host
    # memory at start; at most max_loras resident at once in slots max_lora_rank wide
    loras: tuple[tuple[str, str], ...] = ()
    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    # a file of NAME=SOURCE adapter lines, read at start and followed as it changes (engine/lora_list.py)
    lora_list_file: str | None = None
    # adapters may be loaded and unloaded at run time (POST /v1/load_lora_adapter): max_loras slots from start
    lora_runtime_loads: bool = False
    # speculative decoding (engine/speculative.py): "ngram" proposes up to speculative_tokens tokens per decode
    # step from the sequence's own prompt and output; "off": none
    speculative: str = "off"
    speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS

    @property
    def serves_adapters(self) -> bool:
        """An adapter cache is built: adapters given, listed, or loadable at run time."""
        return bool(self.loras or self.lora_list_file or self.lora_runtime_loads)

    def __post_init__(self) -> None:
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.max_num_batched_tokens < max(self.prefill_chunk, self.max_num_seqs):
            raise ValueError(
                "max_num_batched_tokens must be >= prefill_chunk and >= max_num_seqs "
                f"(got {self.max_num_batched_tokens}, prefill_chunk={self.prefill_chunk}, "
                f"max_num_seqs={self.max_num_seqs})"
            )
        if not 0 <= self.interactive_reserve_slots < self.max_num_seqs:
            raise ValueError(f"interactive_reserve_slots must be in 0..max_num_seqs - 1 (batch work needs a slot), "
                             f"got {self.interactive_reserve_slots} with max_num_seqs={self.max_num_seqs}")
        if min(self.batch_max_preemptions, self.batch_prefill_tokens, self.batch_share_slots) < 0:
            raise ValueError("batch_max_preemptions, batch_prefill_tokens and batch_share_slots must be >= 0, got "
                             f"{self.batch_max_preemptions}, {self.batch_prefill_tokens}, {self.batch_share_slots}")
        if self.small_step_threads is not None and self.small_step_threads < 0:
            raise ValueError(f"small_step_threads must be >= 0 (0: off), got {self.small_step_threads}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(f"kv_cache_memory_bytes must be >= 1, got {self.kv_cache_memory_bytes}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.max_loras < 1 or not 1 <= self.max_lora_rank <= MAX_LORA_RANK_CAP:
            raise ValueError(f"max_loras must be >= 1 and max_lora_rank in 1..{MAX_LORA_RANK_CAP}, got "
                             f"{self.max_loras} and {self.max_lora_rank}")
        if len({name for name, _ in self.loras}) != len(self.loras):
            raise ValueError(f"loras: each adapter needs its own name, got {[name for name, _ in self.loras]}")
        if self.serves_adapters and self.cuda_graphs:
            raise ValueError("cuda_graphs with loras: a captured decode step cannot follow each row's adapter")
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.speculative!r}")
        if not MIN_SPECULATIVE_TOKENS <= self.speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_tokens must be in {MIN_SPECULATIVE_TOKENS}..{MAX_SPECULATIVE_TOKENS}, "
                             f"got {self.speculative_tokens}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
