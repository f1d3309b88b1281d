"""The gateway's own Prometheus metrics: requests, held requests, hold time, retries, wakes, routing time,
residency tiers of pooled models, each pod's load as the gateway sees it, and the keys file's reloads. Every
model series carries `model` and `model_namespace`; `flotilla_gateway_requests_held` is the autoscaler's
pending demand (docs/autoscaling.md).

A request for a LoRA adapter is counted with the adapter's name as `model` (a name the fleet serves, as a
model's is), for the first MAX_ADAPTER_LABELS adapters the gateway counts; later ones count under their base
model's name, so runtime-loaded adapters cannot grow the series without end."""

from __future__ import annotations

from flotilla_contract.metrics import GATEWAY_REQUESTS_HELD, MODEL_LABEL, MODEL_NAMESPACE_LABEL
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from flotilla_gateway.residency import TIERS
from flotilla_gateway.route_map import ModelRoute

REQUESTS = "flotilla_gateway_requests"  # exported as flotilla_gateway_requests_total
HOLD_SECONDS = "flotilla_gateway_hold_seconds"
OLDEST_HELD_SECONDS = "flotilla_gateway_oldest_held_seconds"
MAX_WAIT_SECONDS = "flotilla_gateway_hold_max_wait_seconds"
RETRIES = "flotilla_gateway_upstream_retries"
WAKES = "flotilla_gateway_wakes"
ROUTING_SECONDS = "flotilla_gateway_routing_decision_seconds"
POD_LOAD = "flotilla_gateway_pod_load"
RESIDENCY = "flotilla_gateway_residency_choices"  # exported as flotilla_gateway_residency_choices_total
KEYS_RELOAD_FAILURES = "flotilla_gateway_keys_reload_failures"  # exported as ..._total
KEYS_LOADED_AT = "flotilla_gateway_keys_last_load_timestamp_seconds"
RATE_LIMITED = "flotilla_gateway_rate_limited_requests"  # exported as ..._total
MODEL = (MODEL_LABEL, MODEL_NAMESPACE_LABEL)
STREAM_ERRORS = "flotilla_gateway_stream_errors"  # exported as ..._total
EJECTIONS = "flotilla_gateway_pod_ejections"  # exported as ..._total
EJECTED = "flotilla_gateway_pods_ejected"
RETRY_REASONS = ("connect_error", "dropped_before_body", "pod_gone", "429", "502", "503")
HOLD_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
MAX_ADAPTER_LABELS = 64
ROUTING_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(REQUESTS, "Requests answered, by model, status code, route and tenant.",
                                [*MODEL, "code", "route", "tenant"], registry=r)
        self.held = Gauge(GATEWAY_REQUESTS_HELD, "Requests held while the model has no ready pod.",
                          list(MODEL), registry=r)
        self.hold_seconds = Histogram(HOLD_SECONDS, "Time a request was held before release or refusal.",
                                      list(MODEL), buckets=HOLD_BUCKETS_S, registry=r)
        self.oldest_held = Gauge(OLDEST_HELD_SECONDS, "Age of the oldest held request (0 when none is held).",
                                 list(MODEL), registry=r)
        self.max_wait = Gauge(MAX_WAIT_SECONDS, "The model's spec.coldStart.maxWaitSeconds, while requests are held.",
                              list(MODEL), registry=r)
        self.retries = Counter(RETRIES, "Requests resent to another pod before their first byte, by reason.",
                               [*MODEL, "reason"], registry=r)
        self.stream_errors = Counter(STREAM_ERRORS, "Answers that failed after their first byte reached the client "
                                     "(ended with an SSE error event when streamed), by cause.",
                                     [*MODEL, "cause"], registry=r)
        self.ejections = Counter(EJECTIONS, "Pods taken out of rotation for a cool-down after failing in a row.",
                                 [*MODEL, "pod"], registry=r)
        self.ejected = Gauge(EJECTED, "The model's pods out of rotation now (outlier ejection).", list(MODEL),
                             registry=r)
        self.wakes = Counter(WAKES, "Scale-from-zero writes, by result (woken, lost_race, failed).",
                             [*MODEL, "result"], registry=r)
        self.routing_seconds = Histogram(ROUTING_SECONDS, "Time to choose a pod, by model and policy.",
                                         [*MODEL, "policy"],
                                         buckets=ROUTING_BUCKETS_S, registry=r)
        self.residency = Counter(RESIDENCY, "Pool pods chosen for pooled models, by residency tier (loaded, loading, "
                                            "second_copy, free, lru, busy, unlisted).", [*MODEL, "tier"], registry=r)
        self.pod_load = Gauge(POD_LOAD, "Each pod's load as the gateway sees it, by figure "
                                        "(in_flight, waiting, running, kv_usage, age_seconds).",
                              [*MODEL, "pod", "figure"], registry=r)
        self.keys_reload_failures = Counter(KEYS_RELOAD_FAILURES, "Versions of the API keys file refused while "
                                            "running (the last good keys stayed in force).", registry=r)
        self.keys_loaded_at = Gauge(KEYS_LOADED_AT, "Unix time the API keys in force were loaded (0 without "
                                    "keys).", registry=r)
        self.rate_limited = Counter(RATE_LIMITED, "Requests refused (429) by their API key's rate limit, by tenant and "
                                    "reason (requests, tokens, too_large).", ["tenant", "reason"], registry=r)
        self._adapter_labels: set[str] = set()

    def model_label(self, model: str, base: str | None) -> str:
        """The `model` label of a request naming `model`; `base`: its model when `model` is an adapter."""
        if base is None or model in self._adapter_labels:
            return model
        if len(self._adapter_labels) < MAX_ADAPTER_LABELS:
            self._adapter_labels.add(model)
            return model
        return base

    def count(self, model: str, namespace: str, code: int, route: str, tenant: str) -> None:
        self.requests.labels(model, namespace, str(code), route, tenant).inc()

    def known(self, route: ModelRoute) -> None:
        """Every counter of a model the gateway has seen exists from then on, at 0: a dashboard's rate() of
        retries is 0, not "no data", until the first retry, and the first holds (all released at one wake,
        often before a scrape) count as an increase from 0 rather than as the series' first sample (the
        Prometheus practice for known labels)."""
        self.hold_seconds.labels(route.name, route.namespace)
        for reason in RETRY_REASONS:
            self.retries.labels(route.name, route.namespace, reason)
        self.held.labels(route.name, route.namespace)
        self.ejected.labels(route.name, route.namespace)
        self.stream_errors.labels(route.name, route.namespace, "upstream_dropped")
        self.oldest_held.labels(route.name, route.namespace)
        if route.pool is not None:
            for tier in TIERS:
                self.residency.labels(route.name, route.namespace, tier)

    def wake(self, route: ModelRoute, result: str) -> None:
        self.wakes.labels(route.name, route.namespace, result).inc()
