"""Metrics by request class and tenant: every queue visible on its own, not one global curve.

Queue wait, time to first token and admission refusals carry `class` and `tenant`; the waiting, running and
preemption series carry `class` (http/metrics.py reads them from the queue and the engine at scrape time).
Tenants are client-chosen strings, so their label is bounded: the first MAX_TENANT_LABELS tenants seen keep
their name and every later one reports as "other"; a request with no tenant reports as "none".
"""

from __future__ import annotations

from flotilla_contract import classes as c
from flotilla_contract.metrics import MODEL_LABEL
from prometheus_client import CollectorRegistry, Counter, Histogram

from flotilla_server.engine.sampling_params import SamplingParams

NO_TENANT_LABEL = "none"
ADMISSION_REASONS = ("queue_full", "queue_timeout", c.TENANT_LIMIT, "client_gone")  # refused while queued
_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


class TenantLabels:
    """tenant → its label value; at most `limit` names, then OTHER_TENANTS."""

    def __init__(self, limit: int = c.MAX_TENANT_LABELS) -> None:
        self._limit = limit
        self._named: set[str] = set()

    def __call__(self, tenant: str) -> str:
        if tenant == c.NO_TENANT:
            return NO_TENANT_LABEL
        if tenant in self._named:
            return tenant
        if len(self._named) < self._limit:
            self._named.add(tenant)
            return tenant
        return c.OTHER_TENANTS


class ClassMetrics:
    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.model = model
        self.tenant_label = TenantLabels()
        labels = [MODEL_LABEL, c.CLASS_LABEL, c.TENANT_LABEL]
        self.queue_wait = Histogram(c.CLASS_QUEUE_WAIT_SECONDS, "Time in the admission queue, by class and tenant.",
                                    labels, buckets=_LATENCY_BUCKETS_S, registry=registry)
        self.ttft = Histogram(c.CLASS_TIME_TO_FIRST_TOKEN_SECONDS, "Arrival to first token, by class and tenant.",
                              labels, buckets=_LATENCY_BUCKETS_S, registry=registry)
        self.rejections = Counter(c.CLASS_REJECTIONS, "Requests refused at admission, by class, tenant and reason.",
                                  [*labels, "reason"], registry=registry)
        for request_class in c.REQUEST_CLASSES:  # every class has its series from the start
            self.queue_wait.labels(model, request_class, NO_TENANT_LABEL)
            self.ttft.labels(model, request_class, NO_TENANT_LABEL)
            for reason in ADMISSION_REASONS:
                self.rejections.labels(model, request_class, NO_TENANT_LABEL, reason)

    def _labels(self, params: SamplingParams) -> tuple[str, str, str]:
        return self.model, params.request_class, self.tenant_label(params.tenant)

    def observe_queue_wait(self, params: SamplingParams, seconds: float) -> None:
        self.queue_wait.labels(*self._labels(params)).observe(seconds)

    def observe_ttft(self, params: SamplingParams, seconds: float) -> None:
        self.ttft.labels(*self._labels(params)).observe(seconds)

    def count_rejection(self, params: SamplingParams, reason: str) -> None:
        self.count_refusal(params.request_class, params.tenant, reason)

    def count_refusal(self, request_class: str, tenant: str, reason: str) -> None:
        """A refusal before the body is parsed (the door reads the class and tenant headers)."""
        assert reason in ADMISSION_REASONS, reason
        self.rejections.labels(self.model, request_class, self.tenant_label(tenant), reason).inc()
