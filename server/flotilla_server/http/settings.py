"""ServerSettings: every flag's value in one frozen object, checked once, with the flag names in the errors.

The fields, their defaults and their flags come from one table, flotilla_contract.flags.SERVER_FLAGS
(docs/architecture.md, "Layers"); a test checks that this dataclass and the table name the same fields.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from flotilla_contract import classes as c
from flotilla_contract import flags as f
from flotilla_contract.sizes import parse_bytes

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.messages import EngineOptions


@dataclass(frozen=True)
class ServerSettings:
    model: str | tuple[str, ...] = "tiny"  # several (a tuple) only in multi-model mode
    model_list_file: str | None = None
    unreadable_model_at_start: str = "exit"
    memory_budget_bytes: int | None = None
    load_timeout_s: float = f.DEFAULT_LOAD_TIMEOUT_S
    min_residency_s: float = f.DEFAULT_MIN_RESIDENCY_S
    parked_memory_bytes: int | None = None  # None: the memory budget
    max_parked_models: int = f.DEFAULT_MAX_PARKED_MODELS
    parked_dir: str | None = None
    lora: str | tuple[str, ...] | None = None  # NAME=SOURCE, one or several (docs/serving.md, "LoRA adapters")
    lora_list_file: str | None = None  # NAME=SOURCE lines, re-read on change (engine/lora_list.py)
    lora_dir: str | tuple[str, ...] | None = None  # where POST /v1/load_lora_adapter may read; None: API off
    max_loras: int = f.DEFAULT_MAX_LORAS
    max_lora_rank: int = f.DEFAULT_MAX_LORA_RANK
    served_model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = f.DEFAULT_PORT
    max_num_seqs: int = f.DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = f.DEFAULT_MAX_NUM_BATCHED_TOKENS
    prefill_chunk: int = f.DEFAULT_PREFILL_CHUNK
    block_size: int = f.DEFAULT_BLOCK_SIZE
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = f.DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    queue_depth_per_slot: int = f.DEFAULT_QUEUE_DEPTH_PER_SLOT
    queue_timeout_s: float = f.DEFAULT_QUEUE_TIMEOUT_S
    class_weights: str = f.FLAGS_BY_NAME["--class-weights"].default  # type: ignore[assignment]
    interactive_reserve_slots: int | None = None
    class_queue_timeout_s: str | None = None
    batch_max_preemptions: int = c.DEFAULT_BATCH_MAX_PREEMPTIONS
    batch_prefill_tokens: int = c.DEFAULT_BATCH_PREFILL_TOKENS
    tenant_weights: str | None = None
    tenant_max_running: int | None = None
    tenant_max_queued: int | None = None
    drain_timeout_s: float = f.DEFAULT_DRAIN_TIMEOUT_S
    prefix_caching: str = "on"
    dtype: str = "auto"
    quantization: str | None = None
    small_step_threads: int | None = None
    device: str = "cpu"
    cuda_graphs: str = "auto"
    speculative: str = "off"
    speculative_tokens: int = f.DEFAULT_SPECULATIVE_TOKENS
    max_body_bytes: int = f.DEFAULT_MAX_BODY_BYTES
    engine_mode: str = "process"
    http_processes: int = 1
    grammar_compile_timeout_s: float = f.DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S
    max_grammar_compiles: int = f.DEFAULT_MAX_GRAMMAR_COMPILES
    tool_call_parser: str = "auto"
    log_level: str = "info"
    api_key: str | None = field(default=None, repr=False)  # a secret: kept out of logs and tracebacks

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key (FLOTILLA_API_KEY) is empty: set a key, or leave it unset for no key")
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        if self.queue_depth_per_slot < 1:  # every request waits in the queue, however briefly, before admission
            raise ValueError(f"--queue-depth-per-slot must be >= 1, got {self.queue_depth_per_slot}")
        if self.queue_timeout_s <= 0:
            raise ValueError(f"--queue-timeout-s must be > 0, got {self.queue_timeout_s}")
        self.class_weight_map  # noqa: B018 (each parses once here, so a bad value fails at start-up)
        self.tenant_weight_map  # noqa: B018
        self.class_timeouts_s  # noqa: B018
        reserve = self.reserve_slots
        if self.max_num_seqs >= 1 and not 0 <= reserve < self.max_num_seqs:  # (the engine checks max_num_seqs)
            raise ValueError(f"--interactive-reserve-slots must be in 0..{self.max_num_seqs - 1} (below "
                             f"--max-num-seqs, so that batch work keeps a slot), got {reserve}")
        for name in ("batch_max_preemptions", "batch_prefill_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        for name in ("tenant_max_running", "tenant_max_queued"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (leave it unset for no cap), "
                                 f"got {getattr(self, name)}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"--drain-timeout-s must be >= 0, got {self.drain_timeout_s}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("--served-model-name is empty: give the name clients send as `model`, or leave it unset")
        if self.grammar_compile_timeout_s <= 0:
            raise ValueError(f"--grammar-compile-timeout-s must be > 0, got {self.grammar_compile_timeout_s}")
        if self.max_grammar_compiles < 1:
            raise ValueError(f"--max-grammar-compiles must be >= 1, got {self.max_grammar_compiles}")
        if self.tool_call_parser not in f.TOOL_CALL_PARSERS:
            raise ValueError(f"--tool-call-parser must be one of {', '.join(f.TOOL_CALL_PARSERS)}, "
                             f"got {self.tool_call_parser!r}")
        if self.log_level.lower() not in f.LOG_LEVELS:
            raise ValueError(f"--log-level must be one of {', '.join(f.LOG_LEVELS)}, got {self.log_level!r}")
        if self.unreadable_model_at_start not in f.UNREADABLE_AT_START:
            raise ValueError(f"--unreadable-model-at-start must be one of {', '.join(f.UNREADABLE_AT_START)}, "
                             f"got {self.unreadable_model_at_start!r}")
        if self.quantization is not None and self.quantization not in f.QUANTIZATIONS:
            raise ValueError(f"--quantization must be one of {', '.join(f.QUANTIZATIONS)}, got {self.quantization!r}")
        if self.prefix_caching not in f.PREFIX_CACHING:
            raise ValueError(f"--prefix-caching must be one of {', '.join(f.PREFIX_CACHING)}, got {self.prefix_caching!r}")
        if self.cuda_graphs not in f.CUDA_GRAPHS:
            raise ValueError(f"--cuda-graphs must be one of {', '.join(f.CUDA_GRAPHS)}, got {self.cuda_graphs!r}")
        if self.speculative not in f.SPECULATIVE_METHODS:
            raise ValueError(f"--speculative must be one of {', '.join(f.SPECULATIVE_METHODS)}, got {self.speculative!r}")
        if not f.MIN_SPECULATIVE_TOKENS <= self.speculative_tokens <= f.MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"--speculative-tokens must be in {f.MIN_SPECULATIVE_TOKENS}..{f.MAX_SPECULATIVE_TOKENS}, "
                             f"got {self.speculative_tokens}")
        if self.cuda_graphs == "on" and not self.device.startswith("cuda"):
            raise ValueError(f"--cuda-graphs on needs --device cuda (a CUDA graph runs on a GPU), got --device {self.device}")
        if self.engine_mode not in f.ENGINE_MODES:
            raise ValueError(f"--engine-mode must be one of {', '.join(f.ENGINE_MODES)}, got {self.engine_mode!r}")
        if self.http_processes < 1:
            raise ValueError(f"--http-processes must be >= 1, got {self.http_processes}")
        if self.http_processes > 1 and self.engine_mode != "process":
            raise ValueError(f"--http-processes {self.http_processes} needs --engine-mode process: an engine on a "
                             "thread of one HTTP process cannot serve another")
        if self.http_processes > 1 and self.multi_model:
            raise ValueError(f"--http-processes {self.http_processes} serves one model; in multi-model mode leave "
                             "it at 1")
        if self.http_processes > 1 and min(self.queue_capacity, self.batch_queue_capacity) < self.http_processes:
            raise ValueError(f"--http-processes {self.http_processes} needs a queue place for each HTTP process, for "
                             f"batch requests too: the queue holds {self.queue_capacity} (--queue-depth-per-slot × "
                             f"--max-num-seqs), {self.batch_queue_capacity} of them for batch (less the reserved "
                             "slots' share); raise --queue-depth-per-slot or lower --http-processes")
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        if self.load_timeout_s <= 0:
            raise ValueError(f"--load-timeout-s must be > 0, got {self.load_timeout_s}")
        if self.min_residency_s < 0:
            raise ValueError(f"--min-residency-s must be >= 0, got {self.min_residency_s}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise ValueError(f"--memory-budget must be > 0, got {self.memory_budget_bytes}")
        if self.parked_memory_bytes is not None and self.parked_memory_bytes < 0:
            raise ValueError(f"--parked-memory must be >= 0 (0: park nothing), got {self.parked_memory_bytes}")
        if self.max_parked_models < 0:
            raise ValueError(f"--max-parked-models must be >= 0 (0: park nothing), got {self.max_parked_models}")
        if not self.multi_model and not isinstance(self.model, str):
            raise ValueError("several --model flags need a name each: --model NAME=SOURCE (multi-model mode)")
        self.lora_specs  # noqa: B018 (parsed here, so a bad --lora fails at start-up)
        if self.max_loras < 1:
            raise ValueError(f"--max-loras must be >= 1, got {self.max_loras}")
        if not 1 <= self.max_lora_rank <= f.MAX_LORA_RANK_CAP:
            raise ValueError(f"--max-lora-rank must be in 1..{f.MAX_LORA_RANK_CAP}, got {self.max_lora_rank}")
        for directory in self.lora_dirs:
            if not os.path.isdir(directory):
                raise ValueError(f"--lora-dir {directory!r} is not a directory: give a directory that holds PEFT "
                                 "adapter directories")
        if self.serves_adapters and self.multi_model:
            raise ValueError("--lora, --lora-list-file and --lora-dir serve adapters on one model; in multi-model mode "
                             "each adapter is a line of the model list file (or a --model flag), NAME=SOURCE "
                             "base=BASE: drop them and list the adapters there (--max-loras and --max-lora-rank "
                             "apply to every base)")
        if self.serves_adapters and self.cuda_graphs == "on":
            raise ValueError("--cuda-graphs on does not serve LoRA adapters yet (a captured step cannot follow "
                             "each row's adapter): set --cuda-graphs off or auto")
        if self.multi_model and self.served_model_name is not None:
            raise ValueError("--served-model-name is for one model; in multi-model mode name each model as "
                             "--model NAME=SOURCE")

    @property
    def models(self) -> tuple[str, ...]:
        """Every --model value as given."""
        return (self.model,) if isinstance(self.model, str) else self.model

    @property
    def lora_specs(self) -> tuple[tuple[str, str], ...]:
        """Each --lora NAME=SOURCE as (name, source); names unique and never the served model's own name."""
        given = () if self.lora is None else (self.lora,) if isinstance(self.lora, str) else self.lora
        specs: list[tuple[str, str]] = []
        for text in given:
            name, sep, source = text.partition("=")
            name, source = name.strip(), source.strip()
            if not sep or not name or not source:
                raise ValueError(f"--lora {text!r}: give NAME=SOURCE, SOURCE a PEFT adapter directory")
            if any(name == other for other, _ in specs):
                raise ValueError(f"--lora names the adapter {name!r} twice: give each adapter its own name")
            if name in (self.served_model_name, self.models[0]):
                raise ValueError(f"--lora's adapter {name!r} has the served model's name: a request naming it "
                                 "would be ambiguous; rename the adapter")
            specs.append((name, source))
        return tuple(specs)

    @property
    def lora_dirs(self) -> tuple[str, ...]:
        """Each --lora-dir as given (http/lora_paths.py resolves them when a load asks)."""
        return () if self.lora_dir is None else (self.lora_dir,) if isinstance(self.lora_dir, str) else self.lora_dir

    @property
    def serves_adapters(self) -> bool:
        """Adapters may be served: given at start, listed in a file, or loadable at run time."""
        return bool(self.lora_specs or self.lora_list_file or self.lora_dirs)

    @property
    def multi_model(self) -> bool:
        """Multi-model mode: a model list file, or any --model given as NAME=SOURCE."""
        return self.model_list_file is not None or any("=" in m for m in self.models)

    @property
    def uses_cuda_graphs(self) -> bool:
        """--cuda-graphs auto: on for one model on a GPU (docs/benchmarks.md, "On a GPU": 7.5-7.7x the tokens/s at
        batch 1); off in multi-model mode, whose --memory-budget does not count the graphs' memory."""
        if self.cuda_graphs == "auto":  # and not with adapters: a captured step cannot follow each row's adapter
            return self.device.startswith("cuda") and not self.multi_model and not self.serves_adapters
        return self.cuda_graphs == "on"

    @property
    def queue_capacity(self) -> int:
        """Requests the admission queue holds before answering 429."""
        return self.queue_depth_per_slot * self.max_num_seqs

    @property
    def batch_queue_capacity(self) -> int:
        """Places batch requests may hold: the queue less the interactive reserve's share of it."""
        return self.queue_depth_per_slot * (self.max_num_seqs - self.reserve_slots)

    @property
    def reserve_slots(self) -> int:
        """--interactive-reserve-slots, or its default: an eighth of the slots, at least 1 (none with 1 slot)."""
        if self.interactive_reserve_slots is not None:
            return self.interactive_reserve_slots
        return min(max(1, self.max_num_seqs // 8), self.max_num_seqs - 1)

    @property
    def batch_share_slots(self) -> int:
        """Slots batch work keeps against interactive arrivals: its weighted share of the slots, rounded up."""
        weights = self.class_weight_map
        return math.ceil(self.max_num_seqs * weights[c.BATCH] / sum(weights.values()))

    @property
    def class_weight_map(self) -> dict[str, float]:
        weights = c.parse_weights(self.class_weights, what="--class-weights")
        unknown = sorted(set(weights) - set(c.REQUEST_CLASSES))
        if unknown:
            raise ValueError(f"--class-weights names {', '.join(unknown)}: the classes are "
                             f"{', '.join(c.REQUEST_CLASSES)}")
        return {**c.DEFAULT_CLASS_WEIGHTS, **weights}

    @property
    def tenant_weight_map(self) -> dict[str, float]:
        return c.parse_weights(self.tenant_weights or "", what="--tenant-weights")

    @property
    def class_timeouts_s(self) -> dict[str, float]:
        timeouts = c.parse_weights(self.class_queue_timeout_s or "", what="--class-queue-timeout-s")
        unknown = sorted(set(timeouts) - set(c.REQUEST_CLASSES))
        if unknown:
            raise ValueError(f"--class-queue-timeout-s names {', '.join(unknown)}: the classes are "
                             f"{', '.join(c.REQUEST_CLASSES)}")
        return timeouts

    @property
    def tenant_fairness(self) -> bool:
        """Fair queuing between tenants is on when tenant weights or caps are configured; else FIFO."""
        return bool(self.tenant_weight_map) or self.tenant_max_running is not None or self.tenant_max_queued is not None

    def engine_options(self, measure_threads: bool = False) -> EngineOptions:
        """`measure_threads`: the thread count is the server's default (engine/openmp_env.py), which one
        model's engine on CPU may lower (engine/thread_count.py)."""
        return EngineOptions(
            measure_threads=measure_threads and not self.multi_model and self.device == "cpu",
            log_level=self.log_level, class_weights=tuple(self.class_weight_map.items()),
            tenant_weights=tuple(self.tenant_weight_map.items()), tenant_max_running=self.tenant_max_running,
            tenant_fairness=self.tenant_fairness, served_model_name=self.served_model_name,
        )

    def engine_config(self) -> EngineConfig:
        """The engine's settings; in multi-model mode, every model's (the model itself is set per load)."""
        kv_bytes = self.kv_cache_memory_bytes
        if self.multi_model and kv_bytes is None and self.num_kv_blocks is None:
            kv_bytes = parse_bytes(f.DEFAULT_POOL_KV_CACHE_MEMORY)  # fixed, so it can be counted in the budget
        return EngineConfig(
            model=self.models[0] if not self.multi_model else "tiny", max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            prefill_chunk=self.prefill_chunk, block_size=self.block_size, num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory_bytes=kv_bytes, max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            dtype=self.dtype, quantization=self.quantization, device=self.device, enable_prefix_caching=self.prefix_caching == "on",
            interactive_reserve_slots=self.reserve_slots, batch_max_preemptions=self.batch_max_preemptions,
            batch_prefill_tokens=self.batch_prefill_tokens, batch_share_slots=self.batch_share_slots,
            small_step_threads=self.small_step_threads, cuda_graphs=self.uses_cuda_graphs,
            loras=self.lora_specs, max_loras=self.max_loras, max_lora_rank=self.max_lora_rank,
            lora_list_file=self.lora_list_file, lora_runtime_loads=bool(self.lora_dirs),
            speculative=self.speculative, speculative_tokens=self.speculative_tokens,
        )
