"""EngineCore: the synchronous engine. One `step()` schedules, runs the model once, and reports.

It wires policy (Scheduler) to mechanism (BlockPool, ModelRunner) and adds what only text can
decide: detokenization and stop strings. It has one writer and no lock: the engine loop
(engine/loop.py) applies admissions and aborts only between steps, never between a step's plan and
its execution, so a plan's block tables stay valid until the forward pass that reads them is done
(docs/architecture.md, "Engine").
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from flotilla_server.engine.adapter_cache import start_adapters
from flotilla_server.engine.class_rules import ClassRules
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.decode_graphs import CudaGraphBackend, DecodeGraphs, EagerBackend
from flotilla_server.engine.decode_timer import CONTEXT_TOKENS, DecodeStepTimer
from flotilla_server.engine.detokenizer import IncrementalDetokenizer
from flotilla_server.engine.grammar_book import GrammarBook
from flotilla_server.engine.graph_shapes import DEFAULT_GATHER_BUDGET_TOKENS, GraphShapes
from flotilla_server.engine.kv_pool import BlockPool
from flotilla_server.engine.memory_facts import host_capacity, profile_step_bytes, weights_bytes
from flotilla_server.engine.messages import NOT_SERVED_PREFIX
from flotilla_server.engine.model_runner import ModelRunner
from flotilla_server.engine.outputs import EngineStats, RequestOutput, StepListener, StepRecord, TokenLogprobs
from flotilla_server.engine.pool_sizing import MemoryFacts, plan_pool
from flotilla_server.engine.prefix_keys import REFRESH_S as PREFIX_KEYS_REFRESH_S
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.scheduler import Scheduler, infeasible_reason
from flotilla_server.engine.sequence import Sequence as Seq
from flotilla_server.engine.sequence import new_request
from flotilla_server.engine.speculative import Speculator
from flotilla_server.engine.step_threads import default_small_step_threads
from flotilla_server.engine.thread_count import describe, measure_count
from flotilla_server.grammar.tokenizer_info import GrammarTokenizer
from flotilla_server.model import KVCacheTensors, LoadedModel, load_model
from flotilla_server.model.dtype_choice import choose_dtype, read_cpu_facts
from flotilla_server.model.source import resolve_quantization, source_config

log = logging.getLogger("flotilla.engine")


def _load(config: EngineConfig) -> LoadedModel:
    """The model in config.dtype, `auto` chosen for this model and machine (model/dtype_choice.py); the
    choice is logged with why once the weights have loaded (a refused source says only why it is refused)."""
    on_gpu = config.device != "cpu"
    held = resolve_quantization(config.model, config.quantization)
    # a mixture of experts changes `auto` on CPU only where the weights are float (its config read without them)
    moe = config.dtype == "auto" and not on_gpu and held == "none" and source_config(config.model).moe is not None
    choice = choose_dtype(config.dtype, config.device, held, read_cpu_facts(os.environ),
                          gpu_has_bfloat16=on_gpu and torch.cuda.is_bf16_supported(), moe=moe)
    loaded = load_model(config.model, choice.dtype, config.device, config.quantization)
    log.info("dtype %s: %s", choice.dtype, choice.reason)
    if choice.warning:
        log.warning("%s", choice.warning)
    return loaded


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        sized_from_memory = config.num_kv_blocks is None and config.kv_cache_memory_bytes is None
        on_gpu = config.device != "cpu"
        # host memory is read before the weights load, so that they are subtracted once
        host_bytes, host_limited = host_capacity() if not on_gpu else (0, False)  # also bounds an explicit pool
        self.loaded = loaded or _load(config)
        mc = self.loaded.config
        dtype = self.loaded.model.compute_dtype  # the KV cache's too
        # adapters are read (and refused) before the pool is sized: their slots are counted with the weights
        self.adapters, self.lora_list, self.lora_listed = start_adapters(self.loaded.model, mc, config, dtype)
        adapter_bytes = 0 if self.adapters is None else self.adapters.slots.nbytes()
        per_block = KVCacheTensors.bytes_per_block(mc.num_layers, config.block_size, mc.num_kv_heads, mc.head_dim, dtype)
        # the graphs' gather buffers exist before the pool is sized from free memory: it leaves them room
        captures = config.cuda_graphs and not (on_gpu and mc.moe is not None)
        if config.cuda_graphs and not captures:  # a GPU graph cannot hold a step's host-side expert grouping
            log.warning("cuda_graphs: off for %s, a mixture of experts (model/moe.py groups each step's tokens by "
                        "expert on the host); decode steps run eagerly", mc.model_type)
        graph_gather = (KVCacheTensors.gather_buffers(DEFAULT_GATHER_BUDGET_TOKENS, mc.num_kv_heads, mc.head_dim, dtype,
                                                      config.device) if captures else None)
        facts = MemoryFacts(on_gpu, host_bytes, weights_bytes(self.loaded.model) + adapter_bytes,
                            capacity_is_limit=host_limited)
        if sized_from_memory and on_gpu:
            facts = self._gpu_facts(facts, dtype)
        plan = plan_pool(
            num_kv_blocks=config.num_kv_blocks, kv_cache_memory_bytes=config.kv_cache_memory_bytes,
            gpu_memory_utilization=config.gpu_memory_utilization, max_num_seqs=config.max_num_seqs,
            block_size=config.block_size, requested_max_model_len=config.max_model_len,
            model_context=mc.max_position_embeddings, bytes_per_block=per_block, facts=facts,
        )
        log.info("%s", plan.describe(config.block_size, per_block))
        self.max_model_len = plan.max_model_len
        num_blocks = plan.num_blocks
        # with graphs, the last block is the padding rows' scratch (engine/decode_graphs.py), never handed out
        pool_blocks = num_blocks - 1 if graph_gather is not None else num_blocks
        if pool_blocks < 1:
            raise ValueError(f"cuda_graphs: a pool of {num_blocks} block(s) leaves none beside the graphs' scratch block")
        self.pool = BlockPool(pool_blocks, config.block_size, enable_caching=config.enable_prefix_caching)
        try:
            kv = KVCacheTensors.allocate(
                mc.num_layers, num_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, dtype, config.device
            )
        except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
            raise ValueError(
                f"kv_cache_memory_bytes: a KV cache of {num_blocks} blocks ({num_blocks * per_block} bytes) does not "
                f"fit in {config.device} memory ({str(error).splitlines()[0][:120]}); lower kv_cache_memory_bytes "
                "or num_kv_blocks"
            ) from error
        self.eos_token_ids = frozenset(self.loaded.tokenizer.eos_token_ids) | frozenset(mc.eos_token_ids)
        rules = ClassRules(config.interactive_reserve_slots, config.batch_max_preemptions, config.batch_prefill_tokens,
                           config.batch_share_slots)
        self.scheduler = Scheduler(
            self.pool, config.max_num_seqs, config.max_num_batched_tokens, config.prefill_chunk, self.eos_token_ids,
            rules=rules, adapter_gate=None if self.adapters is None else self._adapter_gate,
            speculator=Speculator(config.speculative_tokens) if config.speculative == "ngram" else None,
        )
        small_step_threads = config.small_step_threads
        if small_step_threads is None:
            small_step_threads = default_small_step_threads(config.device)
        graphs = None
        if graph_gather is not None:
            shapes = GraphShapes(config.max_num_seqs, self.max_model_len, config.block_size)
            backend = CudaGraphBackend(torch.device(config.device)) if on_gpu else EagerBackend()
            graphs = DecodeGraphs(self.loaded.model, kv, shapes, num_blocks - 1, backend, graph_gather)
        self.runner = ModelRunner(self.loaded.model, kv, config.device, config.seed, small_step_threads, graphs,
                                  adapters=self.adapters)
        self._detokenizers: dict[str, dict[int, IncrementalDetokenizer]] = {}  # request id -> choice -> its own
        self._grammars: GrammarBook | None = None  # made by the first grammar
        self._listeners: list[StepListener] = []
        self._last_step_s = 0.0
        self.last_record: StepRecord | None = None
        self._resident_keys: tuple[str, ...] = ()
        self._resident_keys_at = -PREFIX_KEYS_REFRESH_S

    def _gpu_facts(self, facts: MemoryFacts, dtype: torch.dtype) -> MemoryFacts:
        """Profile one step at max_num_batched_tokens; everything else on the device is someone else's."""
        mc = self.loaded.config
        device = torch.device(self.config.device)
        num_tokens = min(self.config.max_num_batched_tokens, mc.max_position_embeddings)
        activation = profile_step_bytes(self.loaded.model, num_tokens, self.config.max_num_seqs, self.config.block_size,
                                        (mc.num_layers, mc.num_kv_heads, mc.head_dim), dtype, device)
        free, total = torch.cuda.mem_get_info(device)
        others = max(0, total - free - facts.weights_bytes)
        return MemoryFacts(True, total, facts.weights_bytes, activation, others)

    def measure_threads(self) -> dict[int, float] | None:
        """Keep the thread count under which a full decode step ran fastest (engine/thread_count.py); on the
        thread that runs the steps, before any request: the count is that thread's. Returns the step seconds
        by count; None when there was nothing to choose from (a GPU, or one thread)."""
        own = torch.get_num_threads()
        if self.config.device != "cpu" or own < 2:
            return None
        rows = self.config.max_num_seqs
        timer = DecodeStepTimer(self.loaded.model, self.runner.kv, rows, min(CONTEXT_TOKENS, self.max_model_len))
        kept, step_s = measure_count(own, timer)
        torch.set_num_threads(kept)
        log.info("%s", describe(rows, step_s, kept))
        return step_s

    # --- grammars (structured output) ------------------------------------------------------------

    @property
    def grammars(self) -> GrammarBook:
        if self._grammars is None:
            info = GrammarTokenizer.of(self.loaded.tokenizer, self.loaded.config.vocab_size, self.eos_token_ids)
            self._grammars = GrammarBook(info)
            self.runner.grammar_vocab_size = info.vocab_size
        return self._grammars

    def grammar_ready(self, params: SamplingParams) -> bool:
        """True if the request needs no grammar or its grammar is built; else its build is started."""
        return params.grammar is None or self.grammars.ready(params.grammar)

    def close(self) -> None:
        """Stop the grammar and mask threads (the engine's end)."""
        if self._grammars is not None:
            self._grammars.close()
        self.runner.close()

    # --- requests -------------------------------------------------------------------------------

    def check_feasible(self, num_prompt_tokens: int, max_tokens: int, n: int = 1) -> str | None:
        return infeasible_reason(
            num_prompt_tokens, max_tokens, self.max_model_len, self.pool.num_blocks, self.pool.block_size,
            n, self.scheduler.max_num_seqs,
        )

    def unknown_adapter(self, params: SamplingParams) -> str | None:
        """Why a request's adapter cannot be served here, or None (the base model, or an adapter held: its key,
        engine/adapter_cache.py; a --lora adapter's key is its name)."""
        if params.lora is None or (self.adapters is not None and params.lora in self.adapters.adapters):
            return None
        return self.not_served(params.lora)

    def not_served(self, name: str) -> str:
        served = ", ".join(self.adapters.served) if self.adapters is not None else "none"
        return f"{NOT_SERVED_PREFIX}{name!r} is not served here (adapters: {served})"

    def _adapter_gate(self, seq: Seq) -> bool:
        """The scheduler's admission check: the sequence's adapter holds a slot now (loaded if one may be freed).
        Pinned: adapters with sequences running or waiting in the engine. Requests still in the engine loop's
        queue do not pin: they wait on the scheduler's waiting sequences, which would wait on them."""
        assert self.adapters is not None and seq.params.lora is not None
        in_use: Counter[str] = Counter()
        for s in (*self.scheduler.running, *self.scheduler.waiting):
            if s.params.lora is not None:
                in_use[s.params.lora] += s.num_seqs
        return self.adapters.acquire(seq.params.lora, in_use)

    def _new_request(self, request_id: str, prompts: list[list[int]], params: SamplingParams) -> list[Seq]:
        unknown = self.unknown_adapter(params)
        if unknown is not None:
            raise ValueError(unknown)
        for prompt in prompts:
            reason = self.check_feasible(len(prompt), params.max_tokens, params.n)
            if reason is not None:
                raise ValueError(reason)
        leaders = new_request(request_id, prompts, params)
        if params.grammar is not None:  # each choice its own state, before the scheduler holds any of them;
            for s in (s for leader in leaders for s in (leader, *leader.forks)):  # add_request waits for a build
                s.matcher = self.grammars.new_matcher(params.grammar)
        return leaders

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                    extra_prompts: Sequence[Sequence[int]] = ()) -> None:
        """Queue a request (n choices of each prompt); it is admitted when it fits. Raises ValueError if it
        never can."""
        leaders = self._new_request(request_id, [list(prompt_token_ids), *map(list, extra_prompts)], params)
        self.scheduler.add(leaders[0], leaders[1:])
        self._track(leaders)

    def try_admit(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams,
                  extra_prompts: Sequence[Sequence[int]] = ()) -> str | None:
        """Admit now if slots and blocks (prompt plus reserve) are free for the first prompt's n choices (the
        other prompts queue inside the engine); else why not ("no_slot", "no_blocks")."""
        leaders = self._new_request(request_id, [list(prompt_token_ids), *map(list, extra_prompts)], params)
        reason = self.scheduler.try_admit(leaders[0], leaders[1:])
        if reason is None:
            self._track(leaders)
        return reason

    def _track(self, leaders: list[Seq]) -> None:
        self._detokenizers[leaders[0].request_id] = {
            s.index: IncrementalDetokenizer(self.loaded.tokenizer, s.prompt_token_ids, s.params.stop)
            for leader in leaders for s in (leader, *leader.forks)
        }

    def abort(self, request_id: str) -> bool:
        """Cancel a request (every choice) and free its blocks now; False if it is unknown or already finished."""
        seq = self.scheduler.abort(request_id)
        for index in self._detokenizers.pop(request_id, {}):
            self.runner.release((request_id, index))
        return seq is not None

    def _forget(self, seq: Seq) -> None:
        choices = self._detokenizers.get(seq.request_id, {})
        choices.pop(seq.index, None)
        if not choices:
            self._detokenizers.pop(seq.request_id, None)
        self.runner.release(seq.key)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # --- a step ---------------------------------------------------------------------------------

    def step(self, after_schedule: Callable[[], None] | None = None) -> list[RequestOutput]:
        """One step. `after_schedule` (tests) runs between the plan and its execution."""
        start = time.perf_counter()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        scheduled = time.perf_counter()
        if self.adapters is not None:
            self.adapters.touch({c.seq.params.lora for c in plan.chunks if c.seq.params.lora is not None})
        if after_schedule is not None:
            after_schedule()
        result = self.runner.execute(plan)
        executed = time.perf_counter()
        logprobs = dict(zip(plan.sampled_seqs(), result.logprobs, strict=True))
        before = {s: s.num_output_tokens for s in plan.sampled_seqs()}  # a drafted row commits several tokens
        changed = self.scheduler.update(plan, result.sampled_token_ids, result.num_accepted)
        updated = time.perf_counter()
        outputs = [self._output(seq, before[seq], logprobs[seq]) for seq in changed]
        held, allocated = self.scheduler.kv_positions()
        end = time.perf_counter()
        record = StepRecord(
            duration_s=end - start,
            forward_s=result.forward_s,
            num_tokens=plan.num_tokens,
            num_prefill_tokens=plan.num_prefill_tokens,
            num_decode_seqs=plan.num_decode_seqs,
            num_prefill_seqs=len(plan.chunks) - plan.num_decode_seqs,
            num_running=self.scheduler.num_slots_used,
            num_waiting=len(self.scheduler.waiting),
            num_preempted=len(plan.preempted),
            kv_blocks_used=self.pool.num_used_blocks,
            kv_blocks_cached=self.pool.num_cached_blocks,
            kv_positions_held=held,
            kv_positions_allocated=allocated,
            schedule_s=scheduled - start,
            prepare_s=result.prepare_s,
            sample_s=result.sample_s,
            update_s=updated - executed,
            detokenize_s=end - updated,
            num_threads=result.num_threads,
            num_constrained_rows=result.num_constrained,
            num_draft_tokens=plan.num_draft_tokens,
            grammar_mask_s=result.mask_s,
            grammar_mask_wait_s=result.mask_wait_s,
        )
        self._last_step_s = record.duration_s
        self.last_record = record
        for listener in self._listeners:
            listener(record)
        return outputs

    def _output(self, seq: Seq, before: int, logprobs: list[TokenLogprobs] | None) -> RequestOutput:
        """The step's news for `seq`, whose output tokens from number `before` on are new (one, or a draft's)."""
        token = seq.output_token_ids[-1]
        detok = self._detokenizers[seq.request_id][seq.index]
        text = ""
        ended_by_eos = seq.is_finished and seq.finish_reason == "stop"
        if seq.num_output_tokens - before > 1:  # a committed draft: a stop string may end it early
            text = self._add_text(seq, before, detok, skip_last=ended_by_eos)
        elif seq.matcher is not None and not ended_by_eos and not seq.matcher.consume_token(token):
            # sampled through its mask, a token is always accepted: a refusal is a bug, never sent as a reply
            log.error("request %s: the grammar refused token %d: %s", seq.request_id, token, seq.matcher.get_error())
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
            seq.finish_reason = "abort"
        elif not ended_by_eos:  # an EOS token has no text
            text = detok.add([token])
        if not ended_by_eos:
            grammar_done = seq.matcher is not None and seq.matcher.is_stopped()  # nothing but EOS may follow
            if (detok.stopped or grammar_done) and not seq.is_finished:
                self.scheduler.finish(seq, "stop")
            elif detok.stopped:
                seq.finish_reason = "stop"  # the stop string came with the last allowed token
        if seq.is_finished:
            text += detok.flush()
            self._forget(seq)
        new = seq.output_token_ids[before:]
        return RequestOutput(
            seq.request_id, new, text, seq.is_finished, seq.finish_reason,
            seq.num_prompt_tokens, seq.num_output_tokens, seq.index, None if logprobs is None else logprobs[:len(new)],
        )

    def _add_text(self, seq: Seq, before: int, detok: IncrementalDetokenizer, skip_last: bool) -> str:
        """Several new tokens' text; with stop strings they go one at a time, and the tokens after the one that
        completes a stop string are dropped, as if generation had ended there."""
        new = seq.output_token_ids[before:len(seq.output_token_ids) - skip_last]  # an EOS token has no text
        if not seq.params.stop:
            return detok.add(new)
        text = ""
        for j, t in enumerate(new):
            text += detok.add([t])
            if detok.stopped:
                del seq.output_token_ids[before + j + 1:]
                if seq.is_finished:
                    seq.finish_reason = "stop"
                break
        return text

    # --- observation ----------------------------------------------------------------------------

    def add_step_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def stats(self) -> EngineStats:
        now = time.monotonic()
        if now - self._resident_keys_at >= PREFIX_KEYS_REFRESH_S:
            self._resident_keys, self._resident_keys_at = self.scheduler.prefix_keys.resident(self.pool.holds), now
        waiting_by_class, running_by_class = self.scheduler.count_by_class()
        return EngineStats(
            waiting_by_class=waiting_by_class,
            running_by_class=running_by_class,
            preemptions_by_class=dict(self.scheduler.preemptions_by_class),
            num_waiting=len(self.scheduler.waiting),
            num_running=self.scheduler.num_slots_used,
            num_slots=self.scheduler.max_num_seqs,
            kv_blocks_used=self.pool.num_used_blocks,
            kv_blocks_total=self.pool.num_blocks,
            kv_blocks_cached=self.pool.num_cached_blocks,
            prefix_cache_queries=self.scheduler.prefix_cache_queries,
            prefix_cache_hits=self.scheduler.prefix_cache_hits,
            num_preemptions=self.scheduler.preemptions,
            deferrals=dict(self.scheduler.deferrals),
            last_step_duration_s=self._last_step_s,
            prefix_keys=self._resident_keys,
            **self._adapter_stats(),
            **({} if self.scheduler.speculator is None else self.scheduler.speculator.stats()),
        )

    def _adapter_stats(self) -> dict:
        a = self.adapters
        if a is None:
            return {}
        return {"adapters_resident": tuple(a.names[key] for key in a.resident if key is not None),
                "adapter_loads": a.loads, "adapter_evictions": a.evictions, "adapter_load_seconds": a.load_seconds,
                "adapters_served": tuple(a.served)}
