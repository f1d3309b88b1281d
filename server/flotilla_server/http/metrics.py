"""The server's Prometheus metrics; the names others read are flotilla_contract.metrics's, written once there.

Every metric carries the label ``model``. Gauges that mirror state (queue depth, running requests, KV
blocks) are read at scrape time from the admission queue and the engine, so they can never drift from
the truth. The Gateway API Inference Extension's model-server gauges (``vllm:*``) are exported beside
ours so its endpoint picker, vLLM dashboards and KEDA recipes work unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from flotilla_contract import classes
from flotilla_contract import metrics as names
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from flotilla_server.engine.outputs import EngineStats, StepRecord
from flotilla_server.http.class_metrics import ClassMetrics
from flotilla_server.http.lora_metrics import LoraMetrics

disable_created_metrics()  # `*_created` series double the exposition and no dashboard or alert reads them

REJECTION_REASONS = names.REJECTION_REASONS
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's: set before it is imported

_LATENCY_BUCKETS_S = names.LATENCY_BUCKETS_S
_ITL_BUCKETS_S = names.ITL_BUCKETS_S
_DURATION_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_STEP_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_STEP_THREAD_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class StateSnapshot:
    """What the scrape-time gauges report; built by the caller from the queue and the engine."""

    requests_waiting: int  # admission queue plus requests waiting inside the engine (preempted)
    requests_running: int
    slots: int
    kv_blocks_total: int
    kv_blocks_used: int
    preemptions: int  # cumulative
    kv_blocks_cached: int = 0  # free blocks still holding a reusable prefix
    prefix_cache_queries: int = 0  # tokens, cumulative
    prefix_cache_hits: int = 0  # tokens, cumulative
    # by request class, every class a key: waiting (queue plus engine), running, preemptions (cumulative)
    waiting_by_class: dict[str, int] = field(default_factory=dict)
    running_by_class: dict[str, int] = field(default_factory=dict)
    preemptions_by_class: dict[str, int] = field(default_factory=dict)
    weight_bytes: int = 0  # the model's weights as held; 0: not loaded (no series)
    quantization: str = "none"
    # speculative decoding, cumulative (engine/speculative.py); None: the server does not speculate (no series)
    spec_drafts: int | None = None
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0


class _StateCollector(Collector):
    def __init__(self, model: str, snapshot: Callable[[], StateSnapshot]) -> None:
        self._model = model
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        ratio = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=[names.MODEL_LABEL])
            g.add_metric([self._model], value)
            return g

        yield gauge(names.REQUESTS_WAITING, "Requests waiting for a slot (admission queue plus preempted).",
                    s.requests_waiting)
        yield gauge(names.REQUESTS_RUNNING, "Sequences holding a slot in the engine (a request with n choices holds n).",
                    s.requests_running)
        yield gauge(names.SLOTS, "Slots: sequences the engine runs at once (max_num_seqs).", s.slots)
        yield gauge(names.KV_BLOCKS_TOTAL, "KV-cache blocks in the pool.", s.kv_blocks_total)
        yield gauge(names.KV_BLOCKS_USED, "KV-cache blocks held by sequences.", s.kv_blocks_used)
        yield gauge(names.KV_BLOCKS_CACHED, "Free KV-cache blocks still holding a reusable prefix (counted as free).",
                    s.kv_blocks_cached)
        yield gauge(names.KV_CACHE_USAGE_RATIO, "KV-cache blocks used ÷ total, in [0, 1].", ratio)
        yield gauge(names.VLLM_REQUESTS_WAITING, "Gateway API Inference Extension: requests waiting.",
                    s.requests_waiting)
        yield gauge(names.VLLM_REQUESTS_RUNNING, "Gateway API Inference Extension: requests running.",
                    s.requests_running)
        yield gauge(names.VLLM_KV_CACHE_USAGE, "Gateway API Inference Extension: KV-cache usage, in [0, 1].",
                    ratio)
        if s.weight_bytes:
            held = GaugeMetricFamily(names.MODEL_WEIGHT_BYTES, "Bytes of weights the model holds (packed copies "
                                     "included), labelled with how they are held.",
                                     labels=[names.MODEL_LABEL, names.QUANTIZATION_LABEL])
            held.add_metric([self._model, s.quantization], s.weight_bytes)
            yield held
        c = CounterMetricFamily(names.PREEMPTIONS, "Sequences preempted by recompute.", labels=[names.MODEL_LABEL])
        c.add_metric([self._model], s.preemptions)
        yield c
        for name, doc, value in (
            (names.PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
            (names.PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.", s.prefix_cache_hits),
            (names.VLLM_PREFIX_CACHE_QUERIES, "vLLM's prefix-cache queries, in tokens.", s.prefix_cache_queries),
            (names.VLLM_PREFIX_CACHE_HITS, "vLLM's prefix-cache hits, in tokens.", s.prefix_cache_hits),
        ):
            c = CounterMetricFamily(name, doc, labels=[names.MODEL_LABEL])
            c.add_metric([self._model], value)
            yield c
        if s.spec_drafts is not None:
            yield from self._speculation(s)
        by_class = [names.MODEL_LABEL, classes.CLASS_LABEL]
        waiting = GaugeMetricFamily(classes.CLASS_REQUESTS_WAITING, "Requests waiting, by class.", labels=by_class)
        running = GaugeMetricFamily(classes.CLASS_REQUESTS_RUNNING, "Sequences holding a slot, by class.",
                                    labels=by_class)
        preempted = CounterMetricFamily(classes.CLASS_PREEMPTIONS, "Sequences preempted, by class.", labels=by_class)
        for request_class in classes.REQUEST_CLASSES:
            waiting.add_metric([self._model, request_class], s.waiting_by_class.get(request_class, 0))
            running.add_metric([self._model, request_class], s.running_by_class.get(request_class, 0))
            preempted.add_metric([self._model, request_class], s.preemptions_by_class.get(request_class, 0))
        yield from (waiting, running, preempted)

    def _speculation(self, s: StateSnapshot) -> Iterator[Metric]:
        for name, doc, value in (
            (names.SPEC_DRAFTS, "Drafts verified (speculative decoding).", s.spec_drafts),
            (names.SPEC_PROPOSED_TOKENS, "Draft tokens proposed and verified.", s.spec_proposed_tokens),
            (names.SPEC_ACCEPTED_TOKENS, "Draft tokens accepted (committed without a step of their own).",
             s.spec_accepted_tokens),
        ):
            c = CounterMetricFamily(name, doc, labels=[names.MODEL_LABEL])
            c.add_metric([self._model], value)
            yield c
        rate = s.spec_accepted_tokens / s.spec_proposed_tokens if s.spec_proposed_tokens else 0.0
        g = GaugeMetricFamily(names.SPEC_ACCEPTANCE_RATE, "Draft tokens accepted ÷ proposed since start, in [0, 1].",
                              labels=[names.MODEL_LABEL])
        g.add_metric([self._model], rate)
        yield g


class ServerMetrics:
    """One registry per server, so several servers (tests) never share series."""

    def __init__(self, model: str, snapshot: Callable[[], StateSnapshot]) -> None:
        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("flotilla_requests", "Requests answered, by HTTP status code (499: client gone).",
                                [names.MODEL_LABEL, "code"], registry=r)
        self.rejections = Counter("flotilla_rejections", "Requests refused or cut short, by reason.",
                                  [names.MODEL_LABEL, "reason"], registry=r)
        self.prompt_tokens = Counter("flotilla_prompt_tokens", "Prompt tokens of admitted requests.",
                                     [names.MODEL_LABEL], registry=r)
        self.generation_tokens = Counter("flotilla_generation_tokens", "Tokens generated and sent.",
                                         [names.MODEL_LABEL], registry=r)
        self.ttft = Histogram(names.TIME_TO_FIRST_TOKEN_SECONDS, "Arrival to first token.",
                              [names.MODEL_LABEL], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.itl = Histogram(names.INTER_TOKEN_LATENCY_SECONDS, "Time between successive tokens of a request.",
                             [names.MODEL_LABEL], buckets=_ITL_BUCKETS_S, registry=r)
        self.request_duration = Histogram("flotilla_request_duration_seconds", "Arrival to the last token (end to end).",
                                          [names.MODEL_LABEL], buckets=_DURATION_BUCKETS_S, registry=r)
        self.queue_wait = Histogram("flotilla_queue_wait_seconds", "Time spent in the admission queue.",
                                    [names.MODEL_LABEL], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.step_duration = Histogram("flotilla_step_duration_seconds", "Duration of one engine step.",
                                       [names.MODEL_LABEL], buckets=_STEP_BUCKETS_S, registry=r)
        self.step_tokens = Histogram("flotilla_step_tokens", "Tokens computed in one engine step.",
                                     [names.MODEL_LABEL], buckets=_STEP_TOKEN_BUCKETS, registry=r)
        self.step_threads = Histogram(names.STEP_THREADS, "CPU threads one engine step ran on (CPU engines only).",
                                      [names.MODEL_LABEL], buckets=_STEP_THREAD_BUCKETS, registry=r)
        # structured output (docs/serving.md, "Structured output")
        self.constrained_requests = Counter("flotilla_constrained_requests", "Requests whose reply follows a grammar, "
                                            "by what asked for it.", [names.MODEL_LABEL, "kind"], registry=r)
        self.grammar_compile = Histogram("flotilla_grammar_compile_seconds", "One grammar compile (its probe), by "
                                         "outcome: compiled, invalid or timeout.", [names.MODEL_LABEL, "outcome"],
                                         buckets=_LATENCY_BUCKETS_S, registry=r)
        self.grammar_lookups = Counter("flotilla_grammar_cache_lookups", "Grammars asked for, by whether their "
                                       "compile was already known or running (hit) or had to start (miss).",
                                       [names.MODEL_LABEL, "result"], registry=r)
        self.grammar_mask = Histogram("flotilla_grammar_mask_seconds", "The token masks' fill in one step with "
                                      "constrained rows, on its thread beside the forward pass.",
                                      [names.MODEL_LABEL], buckets=_STEP_BUCKETS_S, registry=r)
        self.grammar_mask_wait = Histogram("flotilla_grammar_mask_wait_seconds", "What a step with constrained "
                                           "rows waited for their masks after its forward pass.",
                                           [names.MODEL_LABEL], buckets=_STEP_BUCKETS_S, registry=r)
        self.classes = ClassMetrics(r, model)
        state = _StateCollector(model, snapshot)
        r.register(state)
        # what /metrics shows: this registry, or with several HTTP processes (flotilla_server/fronts.py) every process's
        # counters and histograms, which prometheus_client keeps in files under PROMETHEUS_MULTIPROC_DIR,
        # beside the state gauges, which each process reads from the engine's shared stats
        self.exposition = r
        multiprocess_dir = os.environ.get(MULTIPROCESS_DIR_ENV)
        if multiprocess_dir:
            self.exposition = CollectorRegistry()
            MultiProcessCollector(self.exposition, multiprocess_dir)
            self.exposition.register(state)
        for reason in REJECTION_REASONS:  # every reason has a series from the start, at 0
            self.rejections.labels(model, reason)
        self.prompt_tokens.labels(model)
        self.generation_tokens.labels(model)
        # the latency histograms exist at 0 from the start, so the SLO scaler tells an idle server (no request in
        # its window) from one that exports no histogram at all (docs/autoscaling.md, "SLO scaling")
        self.ttft.labels(model)
        self.itl.labels(model)
        self.lora: LoraMetrics | None = None  # the adapter series, on a server that serves adapters

    def serve_adapters(self, stats: Callable[[], EngineStats], max_loras: int) -> None:
        registries = [self.registry] if self.exposition is self.registry else [self.registry, self.exposition]
        self.lora = LoraMetrics(registries, self.model, stats, max_loras)

    def count_adapter_request(self, adapter: str) -> None:
        if self.lora is not None:
            self.lora.count_request(adapter)

    def count_request(self, code: int) -> None:
        self.requests.labels(self.model, str(code)).inc()

    def count_rejection(self, reason: str) -> None:
        assert reason in REJECTION_REASONS, reason
        self.rejections.labels(self.model, reason).inc()

    def observe_step(self, record: StepRecord) -> None:
        """A GPU step (num_threads 0) is not counted in flotilla_step_threads."""
        self.step_duration.labels(self.model).observe(record.duration_s)
        self.step_tokens.labels(self.model).observe(record.num_tokens)
        if record.num_threads:
            self.step_threads.labels(self.model).observe(record.num_threads)
        if record.num_constrained_rows:
            self.grammar_mask.labels(self.model).observe(record.grammar_mask_s)
            self.grammar_mask_wait.labels(self.model).observe(record.grammar_mask_wait_s)

    def grammar_lookup(self, hit: bool) -> None:
        self.grammar_lookups.labels(self.model, "hit" if hit else "miss").inc()

    def grammar_compiled(self, outcome: str, seconds: float) -> None:
        self.grammar_compile.labels(self.model, outcome).observe(seconds)
