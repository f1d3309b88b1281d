"""A multi-model server's /metrics: each model's usual series, plus the model cache's.

Each model keeps one ServerMetrics (its own registry) for the server's life, so its counters survive an
eviction and a reload; the exposition merges every model's families into one (a family name may appear
only once in the text format). The cache's series (flotilla_contract.metrics: load seconds, evictions,
engine deaths, resident models, LRU age, requests per model, the model list's refusals) are read or counted here (docs/serving.md,
"Multi-model mode").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flotilla_contract import metrics as names
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flotilla_server.http.metrics import ServerMetrics, StateSnapshot
from flotilla_server.model_cache.membership import ListStatus
from flotilla_server.model_cache.status import LoadRecord, ModelStatus

_LOAD_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
_LOAD_PHASE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, *_LOAD_BUCKETS_S)  # a parked model's phases take milliseconds
MODEL_STATES = ("loaded", "loading", "available")
REQUEST_OUTCOMES = ("routed", "unknown_model", "infeasible", "load_timeout", "load_failed", "client_gone")


class _Merged(Collector):
    """Every model's registry as one set of families."""

    def __init__(self, per_model: Callable[[], list[ServerMetrics]]) -> None:
        self._per_model = per_model

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for m in self._per_model():
            for family in m.registry.collect():
                into = merged.get(family.name)
                if into is None:
                    merged[family.name] = into = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(family.samples)
        yield from merged.values()


class _CacheGauges(Collector):
    def __init__(self, status: Callable[[], list[ModelStatus]],
                 list_status: Callable[[], ListStatus | None]) -> None:
        self._status = status
        self._list_status = list_status

    def collect(self) -> Iterator[Metric]:
        listing = self._list_status()
        if listing is not None:  # read from the cache at scrape time, as the gauges below
            yield CounterMetricFamily(names.MODEL_LIST_RELOAD_FAILURES, "Versions of the model list file refused "
                                      "(a bad line, an unreadable file); the list before stayed.",
                                      value=listing.reload_failures)
            yield GaugeMetricFamily(names.MODEL_LIST_SKIPPED, "Entries of the model list not served: their source "
                                    "cannot be read.", value=len(listing.skipped))
        models = self._status()
        loaded = [m for m in models if m.state == "loaded"]
        yield GaugeMetricFamily(names.MODELS_RESIDENT, "Models loaded now.", value=len(loaded))
        parked = [m for m in models if m.parked_bytes]
        yield GaugeMetricFamily(names.MODELS_PARKED, "Models parked now: evicted, their weights kept outside the "
                                "memory budget so that they load again quickly.", value=len(parked))
        g = GaugeMetricFamily(names.MODEL_PARKED_BYTES, "Memory each parked model holds outside the budget: its "
                              "parked weights (page cache on CPU, pinned host memory on a GPU) and its process's own.",
                              labels=[names.MODEL_LABEL])
        for m in parked:
            g.add_metric([m.name], float(m.parked_bytes))
        yield g
        ages = [m.idle_s for m in loaded if m.idle_s is not None]
        yield GaugeMetricFamily(names.MODEL_LRU_AGE_SECONDS,
                                "Seconds since the least recently used loaded model served; the next victim's age.",
                                value=max(ages) if ages else 0.0)
        g = GaugeMetricFamily(names.MODEL_STATE, "1 for each model's state (loaded, loading, available).",
                              labels=[names.MODEL_LABEL, "state"])
        for m in models:
            for state in MODEL_STATES:
                g.add_metric([m.name, state], 1.0 if m.state == state else 0.0)
        yield g


class PoolMetrics:
    def __init__(self, status: Callable[[], list[ModelStatus]],
                 list_status: Callable[[], ListStatus | None] = lambda: None) -> None:
        self._per_model: dict[str, ServerMetrics] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.load_seconds = Histogram(names.MODEL_LOAD_SECONDS, "Seconds one model took to load (weights, KV pool, engine).",
                                      buckets=_LOAD_BUCKETS_S, registry=r)
        self.load_phase_seconds = Histogram(
            names.MODEL_LOAD_PHASE_SECONDS, "Seconds of each phase of a load (start: forking or waking the engine "
            "process; read: weights and tokenizer; build: KV pool and runner; warmup: one one-token request), by "
            "where its weights came from (disk, or parked).", ["phase", "origin"], buckets=_LOAD_PHASE_BUCKETS_S,
            registry=r)
        self.evictions = Counter(names.MODEL_EVICTIONS, "Models unloaded to make room (or gone from the list).",
                                 [names.MODEL_LABEL], registry=r)
        self.engine_deaths = Counter(names.MODEL_ENGINE_DEATHS, "Loaded models whose engine stopped by itself "
                                     "(a crash, a killed process); each went back to available.",
                                     [names.MODEL_LABEL], registry=r)
        self.requests = Counter(names.MODEL_REQUESTS, "Generation requests that named each model, by what the "
                                "server did before the model's own queue: routed, or refused and why.",
                                [names.MODEL_LABEL, "outcome"], registry=r)
        r.register(_CacheGauges(status, list_status))
        r.register(_Merged(lambda: list(self._per_model.values())))

    def observe_load(self, name: str, record: LoadRecord) -> None:
        """A finished load's phases (the cache's `loaded` hook)."""
        for phase, seconds in record.phases().items():
            self.load_phase_seconds.labels(phase, record.origin).observe(seconds)

    def for_model(self, name: str, snapshot: Callable[[], StateSnapshot]) -> ServerMetrics:
        """The model's ServerMetrics, made on first use and kept across its evictions."""
        m = self._per_model.get(name)
        if m is None:
            m = self._per_model[name] = ServerMetrics(name, snapshot)
            for outcome in REQUEST_OUTCOMES:
                self.requests.labels(name, outcome)
            self.evictions.labels(name)
            self.engine_deaths.labels(name)
        return m
