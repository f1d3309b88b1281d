"""The operator's own Prometheus metrics, defined once so handlers, the autoscaler and dashboards agree."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECONCILES = Counter(
    "flotilla_operator_reconciles_total",
    "Reconciliations run, by resource kind.",
    ["resource"],
)
RECONCILE_ERRORS = Counter(
    "flotilla_operator_reconcile_errors_total",
    "Reconciliations that raised, by resource kind.",
    ["resource"],
)
AUTOSCALER_DECISIONS = Counter(
    "flotilla_operator_autoscaler_decisions_total",
    "Autoscaler decisions, by model, direction (up, down, hold) and reason.",
    ["namespace", "model", "direction", "reason"],
)
DESIRED_REPLICAS = Gauge(
    "flotilla_operator_desired_replicas",
    "Replicas the operator wants for each InferenceModel.",
    ["namespace", "model"],
)
READY_REPLICAS = Gauge(
    "flotilla_operator_ready_replicas",
    "Ready replicas of each InferenceModel, as its Deployment reports them.",
    ["namespace", "model"],
)
MAX_REPLICAS = Gauge(
    "flotilla_operator_max_replicas",
    "scaling.maxReplicas of each InferenceModel (for the pinned-at-max alert).",
    ["namespace", "model"],
)
PROMETHEUS_QUERY_FAILURES = Counter(
    "flotilla_operator_prometheus_query_failures_total",
    "Prometheus queries by the autoscaler that failed or returned no data.",
    ["reason"],
)
TIER_DECISIONS = Counter(
    "flotilla_operator_tier_decisions_total",
    "Adaptive tier decisions, by the rule that decided (tiering.py's reasons).",
    ["namespace", "model", "reason"],
)
TIER_MOVES = Counter(
    "flotilla_operator_tier_moves_total",
    "Moves of adaptive models between their pool and dedicated replicas: started, done or rolled_back, by target tier.",
    ["namespace", "model", "to", "outcome"],
)
