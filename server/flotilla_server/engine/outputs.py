"""What the engine reports: per-request outputs, per-step records, live statistics.

Plain dataclasses shared by the engine, the HTTP server, the metrics and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprobs:
    """A sampled token's raw log-probability (log_softmax of the model's logits, before penalties,
    temperature, top-k/p and min-p, as vLLM returns by default) and the `logprobs` likeliest tokens."""

    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), likeliest first


@dataclass(frozen=True)
class RequestOutput:
    """One step's news for one choice of a request: the new tokens and the text now safe to show."""

    request_id: str
    token_ids: list[int]  # new this step
    text: str  # new this step; never half a character, never part of a stop string
    finished: bool  # this choice is done
    finish_reason: str | None  # "stop", "length", "abort"
    num_prompt_tokens: int
    num_output_tokens: int  # so far, including this step's
    index: int = 0  # the choice: prompt number x n + j
    logprobs: list[TokenLogprobs] | None = None  # one per token of token_ids, when the request asked


@dataclass(frozen=True)
class StepRecord:
    """One engine step, handed to step listeners on the engine thread."""

    duration_s: float  # whole step: schedule, inputs, forward, sampling, update, detokenize
    forward_s: float  # inside the model: forward and logits
    num_tokens: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_prefill_seqs: int = 0  # sequences with a prefill chunk in this step
    num_running: int = 0  # after the step
    num_waiting: int = 0
    num_preempted: int = 0  # preemptions in this step
    kv_blocks_used: int = 0  # blocks with a ref_count above 0
    kv_blocks_cached: int = 0  # free blocks that still hold a reusable prefix
    kv_positions_held: int = 0  # positions holding tokens, after the step
    kv_positions_allocated: int = 0  # positions in allocated blocks, after the step
    # where the rest of the step went (flotilla-bench steps): the scheduler's plan, the input tensors,
    # sampling (and logprobs), the scheduler's update with the new tokens, detokenization and stop strings
    schedule_s: float = 0.0
    prepare_s: float = 0.0
    sample_s: float = 0.0
    update_s: float = 0.0
    detokenize_s: float = 0.0
    num_threads: int = 0  # CPU threads the forward pass ran on (engine/step_threads.py); 0 on a GPU
    # structured output (engine/grammar_mask.py): the rows sampled through a grammar's mask, the fill's own time
    # on its thread (beside the forward pass), and what of it the step waited for after the forward pass
    num_constrained_rows: int = 0
    num_draft_tokens: int = 0  # proposed tokens verified in this step (engine/speculative.py)
    grammar_mask_s: float = 0.0
    grammar_mask_wait_s: float = 0.0


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int  # sequences queued inside the engine (preempted ones)
    num_running: int  # sequences holding a slot
    num_slots: int  # max_num_seqs
    kv_blocks_used: int
    kv_blocks_total: int
    num_preemptions: int  # since start
    kv_blocks_cached: int = 0  # free blocks that still hold a reusable prefix (counted as free)
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache, since start
    prefix_cache_hits: int = 0  # of those, tokens found
    deferrals: dict[str, int] = field(default_factory=dict)  # refused admissions by reason, since start
    last_step_duration_s: float = 0.0
    prefix_keys: tuple[str, ...] = ()  # gateway prefix keys the prefix cache holds (engine/prefix_keys.py)
    # by request class (every class a key): sequences queued inside the engine, holding slots, preempted
    waiting_by_class: dict[str, int] = field(default_factory=dict)
    running_by_class: dict[str, int] = field(default_factory=dict)
    preemptions_by_class: dict[str, int] = field(default_factory=dict)
    # the engine loop's admission queue (submitted, not yet admitted), by class: what several HTTP processes
    # report (http/state.py), where each holds only its own exact count
    queued_by_class: dict[str, int] = field(default_factory=dict)
    # LoRA adapters (engine/adapter_cache.py): resident now, and copies into and out of the slots since start
    adapters_resident: tuple[str, ...] = ()
    adapter_loads: int = 0
    adapter_evictions: int = 0
    adapter_load_seconds: float = 0.0  # the copies into slots, summed
    adapters_served: tuple[str, ...] = ()  # names a request may send as `model` now (loads and unloads applied)
    # the adapters of sequences running, and of those waiting (in the engine or its admission queue), and the
    # wall-clock time (s since the epoch) either set last changed: vllm:lora_requests_info
    adapters_running: tuple[str, ...] = ()
    adapters_waiting: tuple[str, ...] = ()
    adapters_changed_s: float = 0.0
    # adapters the list file asks for and that are not served: (name, why) (engine/adapter_service.py `refused`)
    adapters_refused: tuple[tuple[str, str], ...] = ()
    # speculative decoding (engine/speculative.py), since start: drafts verified, their tokens, those accepted
    speculating: bool = False  # the engine runs --speculative ngram
    spec_drafts: int = 0
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0


StepListener = Callable[[StepRecord], None]  # told of every step, on the engine thread
