"""LoRA adapter metrics: the adapter cache's state and work, requests by adapter, and the Gateway API
Inference Extension's `vllm:lora_requests_info` (docs/serving.md, "Metrics").

Why: an adapter's traffic, and whether the cache thrashes (loads and evictions climbing while few adapters
are resident), decide where adapter requests should go; the inference extension's endpoint picker reads
`vllm:lora_requests_info` from vLLM servers to prefer pods that run an adapter, and reads it from ours the
same way. The cache's series are read from the engine's stats at scrape time (they cannot drift); the
requests are counted here, as they arrive.

Rules:
- present only on a server that serves adapters (`--lora`, `--lora-list-file` or `--lora-dir`);
- `adapter` is bounded: the first MAX_ADAPTER_LABELS adapters a server sees keep their name, later ones
  report as `other` (a runtime API can make adapter names without end);
- `vllm:lora_requests_info` is one series, as vLLM sets it: labels `running_lora_adapters` and
  `waiting_lora_adapters` (comma-separated names, sorted), `max_lora` (the slots), and as its value the time
  (seconds since the epoch) the two lists last changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flotilla_contract.metrics import MODEL_LABEL
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from flotilla_server.engine.outputs import EngineStats

ADAPTERS_RESIDENT = "flotilla_lora_adapters_resident"
ADAPTER_LOADS = "flotilla_lora_adapter_loads"  # a counter: exposed with _total
ADAPTER_EVICTIONS = "flotilla_lora_adapter_evictions"
ADAPTER_LOAD_SECONDS = "flotilla_lora_adapter_load_seconds"
LORA_REQUESTS = "flotilla_lora_requests"
VLLM_LORA_REQUESTS_INFO = "vllm:lora_requests_info"
ADAPTER_LABEL = "adapter"
MAX_ADAPTER_LABELS = 16
OTHER_ADAPTERS = "other"


class AdapterLabels:
    """adapter name -> its label value: at most `limit` names, then OTHER_ADAPTERS."""

    def __init__(self, limit: int = MAX_ADAPTER_LABELS) -> None:
        self._limit = limit
        self._named: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self._named:
            return name
        if len(self._named) < self._limit:
            self._named.add(name)
            return name
        return OTHER_ADAPTERS


class _AdapterCacheCollector(Collector):
    def __init__(self, model: str, stats: Callable[[], EngineStats], max_loras: int) -> None:
        self._model, self._stats, self._max_loras = model, stats, max_loras

    def collect(self) -> Iterator[Metric]:
        s, model = self._stats(), self._model
        resident = GaugeMetricFamily(ADAPTERS_RESIDENT, "LoRA adapters in the slots now (at most --max-loras).",
                                     labels=[MODEL_LABEL])
        resident.add_metric([model], len(s.adapters_resident))
        yield resident
        for name, doc, value in (
            (ADAPTER_LOADS, "LoRA adapters copied into a slot (from host memory), since start.", s.adapter_loads),
            (ADAPTER_EVICTIONS, "LoRA adapters evicted from a slot for another, since start.", s.adapter_evictions),
        ):
            counter = CounterMetricFamily(name, doc, labels=[MODEL_LABEL])
            counter.add_metric([model], value)
            yield counter
        load = SummaryMetricFamily(ADAPTER_LOAD_SECONDS, "Seconds the copies of LoRA adapters into slots took.",
                                   labels=[MODEL_LABEL])
        load.add_metric([model], count_value=s.adapter_loads, sum_value=s.adapter_load_seconds)
        yield load
        info = GaugeMetricFamily(VLLM_LORA_REQUESTS_INFO, "Gateway API Inference Extension: the LoRA adapters of "
                                 "running and waiting requests; the value is when they last changed (s since "
                                 "the epoch).", labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
        info.add_metric([",".join(s.adapters_running), ",".join(s.adapters_waiting), str(self._max_loras)],
                        s.adapters_changed_s)
        yield info


class LoraMetrics:
    """Registers the adapter series in `registries` (the server's, and its exposition when apart)."""

    def __init__(self, registries: list[CollectorRegistry], model: str, stats: Callable[[], EngineStats],
                 max_loras: int) -> None:
        self.model = model
        self.label = AdapterLabels()
        self.requests = Counter(LORA_REQUESTS, "Requests that named a LoRA adapter as `model`, by adapter (the "
                                f"first {MAX_ADAPTER_LABELS} seen keep their name, later ones are '{OTHER_ADAPTERS}').",
                                [MODEL_LABEL, ADAPTER_LABEL], registry=registries[0])
        cache = _AdapterCacheCollector(model, stats, max_loras)
        for registry in registries:
            registry.register(cache)

    def count_request(self, adapter: str) -> None:
        self.requests.labels(self.model, self.label(adapter)).inc()
