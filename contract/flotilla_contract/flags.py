"""flotilla-server's flags and their defaults: the server parses them, the operator renders them.

One table, so a renamed flag or a changed default cannot drift between the two programs; a test renders
every example through the operator and parses the result with the server's own parser. Each flag can also
be set from the environment variable named after it (`env_var`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flotilla_contract import classes as c

DEFAULT_PORT = 8000
DEFAULT_MAX_NUM_SEQS = 64
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_PREFILL_CHUNK = 512
DEFAULT_BLOCK_SIZE = 16
DEFAULT_QUEUE_DEPTH_PER_SLOT = 8
DEFAULT_QUEUE_TIMEOUT_S = 30.0
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# CPU with no memory limit: the default KV pool takes at most this share of MemAvailable (two servers started
# together on one host stay within half of it) and at most these bytes (docs/serving.md, "KV cache")
SHARED_HOST_KV_SHARE = 0.25
SHARED_HOST_KV_MAX_BYTES = 1024**3
# Multi-model mode (docs/serving.md, "Multi-model mode")
DEFAULT_POOL_KV_CACHE_MEMORY = "256Mi"  # each loaded model's fixed KV pool, counted in the memory budget
DEFAULT_LOAD_TIMEOUT_S = 120.0
DEFAULT_MIN_RESIDENCY_S = 60.0
DEFAULT_MAX_PARKED_MODELS = 4  # evicted models kept parked at once (docs/architecture.md, "Parked models")
DTYPES = ("float32", "bfloat16", "float16")
# --dtype: a dtype, or auto (the default): the server picks one per model (model/dtype_choice.py)
DTYPE_CHOICES = ("auto", *DTYPES)
# how weights are held (docs/models.md, "Quantization"); unset: gguf for a .gguf file, none otherwise
QUANTIZATIONS = ("none", "gguf", "int8", "fp8")
SMALL_STEP_MAX_ROWS = 4  # a step of at most this many rows may borrow the HTTP core (--small-step-threads)
ENGINE_MODES = ("process", "inprocess")
LOG_LEVELS = ("debug", "info", "warning", "error")
PREFIX_CACHING = ("on", "off")
CUDA_GRAPHS = ("auto", "on", "off")
# structured output (docs/serving.md, "Structured output")
DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S = 5.0
DEFAULT_MAX_GRAMMAR_COMPILES = 2
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json")
# a listed model whose source cannot be read at start (docs/serving.md, "The model list file")
UNREADABLE_AT_START = ("exit", "skip")
# LoRA adapters (docs/serving.md, "LoRA adapters")
DEFAULT_MAX_LORAS = 4  # adapters resident in the compute dtype at once
DEFAULT_MAX_LORA_RANK = 16  # the slots' width: the highest rank an adapter may have
MAX_LORA_RANK_CAP = 64  # --max-lora-rank's ceiling (the model runtime's MAX_LORA_RANK)
# speculative decoding (docs/serving.md, "Speculative decoding")
SPECULATIVE_METHODS = ("off", "ngram")
DEFAULT_SPECULATIVE_TOKENS = 8  # k, the tokens a decode step may propose
MIN_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS = 1, 16

Kind = Literal["str", "int", "float", "bytes"]


@dataclass(frozen=True)
class Flag:
    flag: str  # as typed: --max-num-seqs
    dest: str  # the settings field: max_num_seqs
    kind: Kind  # how the text is parsed; "bytes" takes sizes such as 8Gi
    default: str | int | float | None
    help: str
    repeatable: bool = False  # may be given several times; the settings field then holds a tuple

    @property
    def env(self) -> str:
        return env_var(self.flag)


def env_var(flag: str) -> str:
    """--kv-cache-memory → FLOTILLA_KV_CACHE_MEMORY: the variable is named after the flag users see."""
    return "FLOTILLA_" + flag.removeprefix("--").upper().replace("-", "_")


SERVER_FLAGS: tuple[Flag, ...] = (
    Flag("--model", "model", "str", "tiny",
         "A Hugging Face model directory, a .gguf file (Llama), or 'tiny' (the built-in DEMONSTRATION model). Repeat it as "
         "--model NAME=SOURCE to serve several models from one memory budget (multi-model mode).",
         repeatable=True),
    Flag("--model-list-file", "model_list_file", "str", None,
         "A file of NAME=SOURCE lines (multi-model mode; SOURCE: tiny or an absolute path), re-read when it "
         "changes: a new line becomes loadable without a restart. Parsed strictly: a bad line refuses the "
         "file (at start: exit 2; on a reload: the list before stays); an unreadable source skips its line on a "
         "reload, and at start as --unreadable-model-at-start says."),
    Flag("--unreadable-model-at-start", "unreadable_model_at_start", "str", "exit",
         "A listed model whose source cannot be read at start: exit (exit 2, naming it) or skip (serve the others, "
         "try it again every 10 s; the operator sets skip for a ModelPool's pods, so one member's missing files "
         "cannot stop the others). A --model flag's source must always read."),
    Flag("--memory-budget", "memory_budget_bytes", "bytes", None,
         "Multi-model mode: memory that loaded models (weights and KV pools) may hold, e.g. 60Gi; default: "
         "80% of the GPU, or half the RAM on CPU."),
    Flag("--load-timeout-s", "load_timeout_s", "float", DEFAULT_LOAD_TIMEOUT_S,
         "Multi-model mode: how long a request for a model that is not loaded waits for its load, seconds."),
    Flag("--min-residency-s", "min_residency_s", "float", DEFAULT_MIN_RESIDENCY_S,
         "Multi-model mode: a loaded model is never evicted sooner than this after its load, seconds."),
    Flag("--parked-memory", "parked_memory_bytes", "bytes", None,
         "Multi-model mode: memory that parked models may hold outside --memory-budget, e.g. 4Gi. An evicted model "
         "is parked: its engine process keeps its weights (on CPU memory-mapped from a file under --parked-dir, "
         "page cache the kernel may drop; on a GPU in pinned host memory) and its next load wakes it, skipping the "
         "fork and the read. Counted: the parked weights and each parked process's own memory; past this, the "
         "least recently parked go. Default: the memory budget on CPU, 0 (nothing is parked) on a GPU, where each "
         "parked process also keeps its CUDA context outside the budget."),
    Flag("--max-parked-models", "max_parked_models", "int", DEFAULT_MAX_PARKED_MODELS,
         "Multi-model mode: most models parked at once (each keeps an engine process); 0: nothing is parked."),
    Flag("--parked-dir", "parked_dir", "str", None,
         "Multi-model mode: the folder that holds parked models' weight files on CPU (the server writes them in a "
         "folder of its own there and removes it on exit); use a disk-backed folder, not tmpfs. Default: the "
         "system's temporary folder."),
    Flag("--lora", "lora", "str", None,
         "A LoRA adapter served on the model: NAME=SOURCE, SOURCE a PEFT adapter directory (adapter_config.json "
         "and adapter_model.safetensors). Repeat it for more. A request names it as `model`; GET /v1/models lists "
         "it with the model as its parent. An adapter that does not fit the model refuses the start (exit 2).",
         repeatable=True),
    Flag("--lora-list-file", "lora_list_file", "str", None,
         "A file of LoRA adapters, one NAME=SOURCE a line (# comments, blank lines ignored), re-read when it "
         "changes (checked every second): an added line is loaded, a removed one unloaded as "
         "/v1/unload_lora_adapter does. At start a bad line or adapter exits 2 naming it; on a re-read it is "
         "logged and skipped while the other lines apply."),
    Flag("--lora-dir", "lora_dir", "str", None,
         "A directory that POST /v1/load_lora_adapter may read adapters from (its lora_path must lie under it, "
         "symlinks resolved); repeat it for more. Unset: the runtime adapter API (load and unload) is off, 403. "
         "Adapters loaded through it do not survive a restart unless listed (--lora, --lora-list-file).",
         repeatable=True),
    Flag("--max-loras", "max_loras", "int", DEFAULT_MAX_LORAS,
         "LoRA adapters resident at once (slots allocated at start, in the compute dtype); the others wait in "
         "host memory and are loaded on first use, evicting the least recently used adapter without requests."),
    Flag("--max-lora-rank", "max_lora_rank", "int", DEFAULT_MAX_LORA_RANK,
         f"The adapter slots' width: the highest LoRA rank served (at most {MAX_LORA_RANK_CAP}); an adapter of a "
         "higher rank refuses the start."),
    Flag("--served-model-name", "served_model_name", "str", None,
         "Name clients send as `model`; default: the model's name."),
    Flag("--host", "host", "str", "0.0.0.0", "Address to listen on."),
    Flag("--port", "port", "int", DEFAULT_PORT, "TCP port to listen on."),
    Flag("--max-num-seqs", "max_num_seqs", "int", DEFAULT_MAX_NUM_SEQS, "Slots: sequences the engine runs at once."),
    Flag("--max-num-batched-tokens", "max_num_batched_tokens", "int", DEFAULT_MAX_NUM_BATCHED_TOKENS,
         "Token budget of one engine step."),
    Flag("--prefill-chunk", "prefill_chunk", "int", DEFAULT_PREFILL_CHUNK,
         "Longest prefill piece of one sequence in one step."),
    Flag("--block-size", "block_size", "int", DEFAULT_BLOCK_SIZE, "KV-cache positions per block (a power of two)."),
    Flag("--num-kv-blocks", "num_kv_blocks", "int", None,
         "KV-cache pool size in blocks (overrides --kv-cache-memory)."),
    Flag("--gpu-memory-utilization", "gpu_memory_utilization", "float", DEFAULT_GPU_MEMORY_UTILIZATION,
         "Share of the device's memory the server may use (weights, activations, KV cache); the KV pool gets "
         "what is left after the weights and one profiled step. On CPU: the share of the container's memory "
         "limit (or of the memory available, with no limit; then see "
         "--kv-cache-memory), and the pool never exceeds every slot at --max-model-len."),
    Flag("--kv-cache-memory", "kv_cache_memory_bytes", "bytes", None,
         "KV-cache pool size in bytes, e.g. 8Gi (overrides --gpu-memory-utilization; "
         f"multi-model mode: each model's fixed pool, default {DEFAULT_POOL_KV_CACHE_MEMORY}). Unset on CPU with no "
         f"memory limit, the pool takes at most {SHARED_HOST_KV_SHARE:.0%} of MemAvailable and at most "
         f"{SHARED_HOST_KV_MAX_BYTES // 1024**3} GiB, so that other servers and programs on the host fit; set it "
         "to take more."),
    Flag("--max-model-len", "max_model_len", "int", None,
         "Context limit (prompt + output tokens); default: the model's, capped by what the KV pool holds "
         "for one sequence."),
    Flag("--queue-depth-per-slot", "queue_depth_per_slot", "int", DEFAULT_QUEUE_DEPTH_PER_SLOT,
         "Admission queue depth per slot, at least 1; the queue holds this × --max-num-seqs before answering 429."),
    Flag("--queue-timeout-s", "queue_timeout_s", "float", DEFAULT_QUEUE_TIMEOUT_S,
         "Longest wait in the admission queue before 429, seconds."),
    Flag("--class-weights", "class_weights", "str",
         ",".join(f"{k}={v:g}" for k, v in c.DEFAULT_CLASS_WEIGHTS.items()),
         "Weighted fair queuing between request classes (X-Flotilla-Class or `flotilla_class`): NAME=WEIGHT for "
         f"{' and '.join(c.REQUEST_CLASSES)}; of the admissions while both wait, each class gets its weight's share."),
    Flag("--interactive-reserve-slots", "interactive_reserve_slots", "int", None,
         "Slots only interactive requests may take (batch work fills the rest); default: --max-num-seqs / 8, "
         "at least 1; 0 turns the reserve off."),
    Flag("--class-queue-timeout-s", "class_queue_timeout_s", "str", None,
         "Per-class wait budgets in the admission queue, CLASS=SECONDS (e.g. batch=600); a class not named waits "
         "--queue-timeout-s."),
    Flag("--batch-max-preemptions", "batch_max_preemptions", "int", c.DEFAULT_BATCH_MAX_PREEMPTIONS,
         "A batch request gives its slot to a waiting interactive one at most this many times, then keeps it."),
    Flag("--batch-prefill-tokens", "batch_prefill_tokens", "int", c.DEFAULT_BATCH_PREFILL_TOKENS,
         "Prefill tokens batch requests may take in one engine step while interactive work waits or prefills."),
    Flag("--tenant-weights", "tenant_weights", "str", None,
         "Weighted fair queuing between tenants within a class (X-Flotilla-Tenant or `user`): NAME=WEIGHT, "
         "a tenant not named weighs 1. Tenant fairness is on when this or a tenant cap is set; else FIFO."),
    Flag("--tenant-max-running", "tenant_max_running", "int", None,
         "Requests one tenant may have running at once; more wait in the queue. Default: no cap."),
    Flag("--tenant-max-queued", "tenant_max_queued", "int", None,
         "Requests one tenant may have waiting; more get 429 tenant_limit with Retry-After. Default: no cap."),
    Flag("--drain-timeout-s", "drain_timeout_s", "float", DEFAULT_DRAIN_TIMEOUT_S,
         "On SIGTERM, how long in-flight requests may take to finish before the process exits, seconds."),
    Flag("--prefix-caching", "prefix_caching", "str", "on",
         "Reuse the KV blocks of prompts' common prefixes (system prompts, earlier turns): on or off."),
    Flag("--dtype", "dtype", "str", "auto",
         f"Weights and KV-cache dtype: {', '.join(DTYPE_CHOICES)}. auto picks per model: on a GPU bfloat16; on CPU "
         "float32 for weights held as gguf or int8 (their kernels multiply float32) and for a mixture of experts "
         "(its experts' few-row products run faster in float32), else bfloat16 where the CPU "
         "computes it natively (avx512_bf16 or AMX) and float32 where it would be emulated. The log says which "
         "and why."),
    Flag("--quantization", "quantization", "str", None,
         f"How weights are held: {', '.join(QUANTIZATIONS)}. gguf keeps a .gguf file's quantized blocks (Q8_0, "
         "Q5_0, Q5_1, Q4_0, Q4_1, Q2_K to Q6_K) as they are on CPU (F16/BF16, and every type on a GPU, are "
         "dequantized to --dtype); int8 quantizes any model's projections, embedding and head to per-channel int8 "
         "at load (CPU only; not a mixture of experts; every "
         "layer's input width a multiple of 16); fp8 quantizes any model's projections to e4m3 with per-channel "
         "scales at load (a GPU of compute capability 8.9 or later; sizes multiples of 16); none dequantizes "
         "every weight to --dtype at load. Default: gguf for a .gguf file, none otherwise. In multi-model mode, "
         "every model's default."),
    Flag("--small-step-threads", "small_step_threads", "int", None,
         f"CPU threads an engine step of at most {SMALL_STEP_MAX_ROWS} rows may run on, borrowing the core otherwise left "
         "to HTTP (such a step reads every weight for a few rows: memory-bound); the engine measures both counts "
         "and runs the faster. Default: every CPU the process may use (its cores, capped by its container's CPU "
         "quota); 0: such steps keep the engine's own count. Multi-model mode: never more than each engine's "
         "share of the threads."),
    Flag("--device", "device", "str", "cpu", "cpu or cuda[:N]."),
    Flag("--cuda-graphs", "cuda_graphs", "str", "auto",
         "on: replay pure decode steps of up to 256 sequences from captured CUDA graphs, padded to 1, 2, 4 or a "
         "multiple of 8 rows and a power of two of KV blocks (needs --device cuda); off: every step eager; auto: "
         "on for one model on a GPU, off on CPU and in multi-model mode."),
    Flag("--speculative", "speculative", "str", "off",
         "Speculative decoding: ngram proposes the tokens that followed the latest earlier occurrence of a "
         "sequence's last few tokens in its own prompt and output, and verifies them in the step's one forward "
         "pass (greedy output unchanged; sampling keeps its distribution); a sequence whose proposals keep failing "
         "stops proposing for a while. off: none. A request may opt out with `speculative: false`."),
    Flag("--speculative-tokens", "speculative_tokens", "int", DEFAULT_SPECULATIVE_TOKENS,
         f"With --speculative ngram: most tokens one decode step proposes, "
         f"{MIN_SPECULATIVE_TOKENS} to {MAX_SPECULATIVE_TOKENS}."),
    Flag("--max-body-bytes", "max_body_bytes", "bytes", DEFAULT_MAX_BODY_BYTES,
         "Largest request body accepted; larger gets 413."),
    Flag("--engine-mode", "engine_mode", "str", "process",
         "process: the engine runs in its own process (no shared GIL with HTTP); inprocess: on a thread of the "
         "HTTP process (tests, comparison)."),
    Flag("--http-processes", "http_processes", "int", 1,
         "HTTP processes sharing the port (SO_REUSEPORT), each with its own pipe to the one engine process and "
         "its share of the queue; more split a burst's refusals and the streams' encoding across cores. One "
         "model, --engine-mode process."),
    Flag("--grammar-compile-timeout-s", "grammar_compile_timeout_s", "float", DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S,
         "Longest a JSON schema or tool grammar may take to compile, seconds; past it the compile's process is "
         "killed and the request gets a 400 naming this limit, and that grammar is refused at once from then on."),
    Flag("--max-grammar-compiles", "max_grammar_compiles", "int", DEFAULT_MAX_GRAMMAR_COMPILES,
         "Grammar compiles running at once (one process each, niced below the engine); more wait their turn."),
    Flag("--tool-call-parser", "tool_call_parser", "str", "auto",
         f"How tool calls are read from a reply: {', '.join(TOOL_CALL_PARSERS)}. auto: from the chat template "
         "(<tool_call> tags: hermes; <|python_tag|>: llama3_json); a template without tools gets a system prompt "
         "that asks for hermes tags."),
    Flag("--log-level", "log_level", "str", "info", f"{', '.join(LOG_LEVELS)}."),
    Flag("--api-key", "api_key", "str", None,
         "Require 'Authorization: Bearer <key>' on the OpenAI endpoints (/v1/...), else 401; probes, /metrics "
         "and /flotilla/v1/load stay open. Prefer the environment variable: a flag shows in the process list."),
)

FLAGS_BY_NAME = {f.flag: f for f in SERVER_FLAGS}

# Flags that size one model's memory from the device; multi-model mode refuses them (a fixed KV pool per
# model, and --memory-budget over all). A name not in SERVER_FLAGS is ignored until the flag exists.
MULTI_MODEL_REFUSED_FLAGS = ("--gpu-memory-utilization",)
