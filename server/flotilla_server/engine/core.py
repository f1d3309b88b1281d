"""EngineCore: the synchronous engine. One `step()` schedules, runs the model once, and reports.

It wires policy (Scheduler) to mechanism (BlockPool, ModelRunner) and adds what only text can
decide: detokenization and stop strings. A lock guards the scheduler's state so that another
thread may admit or abort while a step's forward pass runs (EngineClient); the forward pass itself
runs outside the lock. Blocks freed by an abort are reused only by a later `schedule()`, after the
forward pass that may still write them has finished.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence

from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.detokenizer import IncrementalDetokenizer
from flotilla_server.engine.kv_pool import BlockPool, blocks_for
from flotilla_server.engine.model_runner import ModelRunner
from flotilla_server.engine.outputs import EngineStats, RequestOutput, StepListener, StepRecord
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.scheduler import Scheduler, infeasible_reason
from flotilla_server.engine.sequence import Sequence as Seq
from flotilla_server.model import KVCacheTensors, LoadedModel, load_model
from flotilla_server.model.loader import torch_dtype

log = logging.getLogger(__name__)


def resolve_num_blocks(config: EngineConfig, max_model_len: int, bytes_per_block: int) -> int:
    """Pool size: --num-kv-blocks, else --kv-cache-memory, else every slot at max_model_len."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory_bytes is not None:
        n = config.kv_cache_memory_bytes // bytes_per_block
        if n < 1:
            raise ValueError(
                f"kv_cache_memory_bytes={config.kv_cache_memory_bytes} is less than one KV block "
                f"({bytes_per_block} bytes); give the KV cache more memory"
            )
        return n
    return config.max_num_seqs * blocks_for(max_model_len, config.block_size)


def check_fits(kv_bytes: int, device: str) -> None:
    """Refuses, before touching memory, a KV cache larger than the device's whole memory (on CPU, the RAM)."""
    if device == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        import torch

        total = torch.cuda.mem_get_info(torch.device(device))[1]
    if kv_bytes > total:
        raise ValueError(f"kv_cache_memory_bytes: a KV cache of {kv_bytes} bytes is more than the {total} bytes of "
                         f"{device} memory; lower kv_cache_memory_bytes or num_kv_blocks")


def resolve_max_model_len(config: EngineConfig, model_len: int) -> int:
    """--max-model-len, else the model's context; a limit over the model's is refused, never silently cut."""
    if config.max_model_len is None:
        return model_len
    if not 0 < config.max_model_len <= model_len:
        raise ValueError(f"max_model_len {config.max_model_len} is outside the model's context of 1..{model_len} "
                         "tokens; lower it or leave it unset")
    return config.max_model_len


def cap_to_pool(config: EngineConfig, max_model_len: int, num_blocks: int) -> int:
    """The context one sequence can really hold: what the pool has room for, when that is less."""
    pool_len = num_blocks * config.block_size
    if pool_len >= max_model_len:
        return max_model_len
    if config.max_model_len is not None:  # asked for explicitly: refuse rather than serve less
        raise ValueError(
            f"max_model_len {max_model_len} needs {blocks_for(max_model_len, config.block_size)} KV blocks for "
            f"one sequence but the pool has {num_blocks}; give the KV cache more (num_kv_blocks, "
            "kv_cache_memory_bytes) or lower max_model_len"
        )
    log.warning("context limited to %d tokens (the model's is %d): one sequence fills the KV pool of %d blocks; "
                "raise --num-kv-blocks or --kv-cache-memory for more", pool_len, max_model_len, num_blocks)
    return pool_len


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded or load_model(config.model, config.dtype, config.device)
        mc = self.loaded.config
        self.max_model_len = resolve_max_model_len(config, mc.max_position_embeddings)
        dtype = torch_dtype(config.dtype)
        per_block = KVCacheTensors.bytes_per_block(mc.num_layers, config.block_size, mc.num_kv_heads, mc.head_dim, dtype)
        num_blocks = resolve_num_blocks(config, self.max_model_len, per_block)
        check_fits(num_blocks * per_block, config.device)  # before the pool's bookkeeping grows with it
        self.max_model_len = cap_to_pool(config, self.max_model_len, num_blocks)
        self.pool = BlockPool(num_blocks, config.block_size, enable_caching=config.enable_prefix_caching)
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
        self.scheduler = Scheduler(
            self.pool, config.max_num_seqs, config.max_num_batched_tokens, config.prefill_chunk, self.eos_token_ids
        )
        self.runner = ModelRunner(self.loaded.model, kv, config.device, config.seed)
        self.lock = threading.Lock()  # guards scheduler, pool and detokenizers
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._listeners: list[StepListener] = []
        self._last_step_s = 0.0

    # --- requests -------------------------------------------------------------------------------

    def check_feasible(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        return infeasible_reason(
            num_prompt_tokens, max_tokens, self.max_model_len, self.pool.num_blocks, self.pool.block_size
        )

    def _new_sequence(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> Seq:
        reason = self.check_feasible(len(prompt_token_ids), params.max_tokens)
        if reason is not None:
            raise ValueError(reason)
        return Seq(request_id, list(prompt_token_ids), params, ticket=-1)

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Queue a request; it is admitted when it fits. Raises ValueError if it never can."""
        seq = self._new_sequence(request_id, prompt_token_ids, params)
        with self.lock:
            self.scheduler.add(seq)
            self._detokenizers[request_id] = self._detokenizer(seq)

    def try_admit(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams) -> str | None:
        """Admit now if a slot and blocks (prompt plus reserve) are free; else why not ("no_slot", "no_blocks")."""
        seq = self._new_sequence(request_id, prompt_token_ids, params)
        with self.lock:
            reason = self.scheduler.try_admit(seq)
            if reason is None:
                self._detokenizers[request_id] = self._detokenizer(seq)
            return reason

    def _detokenizer(self, seq: Seq) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.loaded.tokenizer, seq.prompt_token_ids, seq.params.stop)

    def abort(self, request_id: str) -> bool:
        """Cancel a request and free its blocks now; False if it is unknown or already finished."""
        with self.lock:
            seq = self.scheduler.abort(request_id)
            self._forget(request_id)
            return seq is not None

    def _forget(self, request_id: str) -> None:
        self._detokenizers.pop(request_id, None)
        self.runner.release(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # --- a step ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        with self.lock:
            plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        result = self.runner.execute(plan)
        with self.lock:
            changed = self.scheduler.update(plan, result.sampled_token_ids)
            outputs = [self._output(seq) for seq in changed]
            held, allocated = self.scheduler.kv_positions()
            record = StepRecord(
                duration_s=time.perf_counter() - start,
                forward_s=result.forward_s,
                num_tokens=plan.num_tokens,
                num_prefill_tokens=plan.num_prefill_tokens,
                num_decode_seqs=plan.num_decode_seqs,
                num_prefill_seqs=len(plan.chunks) - plan.num_decode_seqs,
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                num_preempted=len(plan.preempted),
                kv_blocks_used=self.pool.num_used_blocks,
                kv_blocks_cached=self.pool.num_cached_blocks,
                kv_positions_held=held,
                kv_positions_allocated=allocated,
            )
        self._last_step_s = record.duration_s
        for listener in self._listeners:
            listener(record)
        return outputs

    def _output(self, seq: Seq) -> RequestOutput:
        token = seq.output_token_ids[-1]
        detok = self._detokenizers[seq.request_id]
        text = ""
        if not (seq.is_finished and seq.finish_reason == "stop"):  # an EOS token has no text
            text = detok.add([token])
            if detok.stopped and not seq.is_finished:
                self.scheduler.finish(seq, "stop")
            elif detok.stopped:
                seq.finish_reason = "stop"  # the stop string came with the last allowed token
        if seq.is_finished:
            text += detok.flush()
            self._forget(seq.request_id)
        return RequestOutput(
            seq.request_id, [token], text, seq.is_finished, seq.finish_reason,
            seq.num_prompt_tokens, seq.num_output_tokens,
        )

    # --- observation ----------------------------------------------------------------------------

    def add_step_listener(self, listener: StepListener) -> None:
        self._listeners.append(listener)

    def stats(self) -> EngineStats:
        with self.lock:
            return EngineStats(
                num_waiting=len(self.scheduler.waiting),
                num_running=len(self.scheduler.running),
                num_slots=self.scheduler.max_num_seqs,
                kv_blocks_used=self.pool.num_used_blocks,
                kv_blocks_total=self.pool.num_blocks,
                kv_blocks_cached=self.pool.num_cached_blocks,
                prefix_cache_queries=self.scheduler.prefix_cache_queries,
                prefix_cache_hits=self.scheduler.prefix_cache_hits,
                num_preemptions=self.scheduler.preemptions,
                deferrals=dict(self.scheduler.deferrals),
                last_step_duration_s=self._last_step_s,
            )
