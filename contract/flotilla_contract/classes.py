"""Request classes and tenants: the names and defaults that the server, the operator, the gateway, the
dashboards and the alerts must agree on (docs/serving.md, "Priorities and tenants").

A request is `interactive` (the default) or `batch`, from the `X-Flotilla-Class` header or the
`flotilla_class` body field; its tenant comes from `X-Flotilla-Tenant` (the gateway sets it from the API
key) or the OpenAI `user` field. Interactive work goes first by weight and keeps a reserve of slots; batch
work fills idle capacity and never starves.
"""

from __future__ import annotations

INTERACTIVE = "interactive"
BATCH = "batch"
REQUEST_CLASSES = (INTERACTIVE, BATCH)  # most urgent first: preemption takes the last class first
DEFAULT_REQUEST_CLASS = INTERACTIVE
CLASS_FIELD = "flotilla_class"  # the body field beside the header

# weighted fair queuing between classes: of the admissions while both wait, interactive gets 8 in 9
DEFAULT_CLASS_WEIGHTS = {INTERACTIVE: 8.0, BATCH: 1.0}
# slots only interactive work may take; None: max_num_seqs // 8, at least 1 (0 turns the reserve off)
DEFAULT_INTERACTIVE_RESERVE_SLOTS: int | None = None
# a batch request is preempted for a waiting interactive one at most this many times (then it keeps its slot)
DEFAULT_BATCH_MAX_PREEMPTIONS = 4
# prefill tokens batch work may take in one step while interactive work waits or prefills
DEFAULT_BATCH_PREFILL_TOKENS = 64
NO_TENANT = ""  # a request that names no tenant

# metrics by class and tenant; `tenant` takes at most MAX_TENANT_LABELS values, the rest report as "other"
CLASS_LABEL = "class"
TENANT_LABEL = "tenant"
MAX_TENANT_LABELS = 16
OTHER_TENANTS = "other"
CLASS_REQUESTS_WAITING = "flotilla_class_requests_waiting"  # gauge {class}
CLASS_REQUESTS_RUNNING = "flotilla_class_requests_running"  # gauge {class}
CLASS_QUEUE_WAIT_SECONDS = "flotilla_class_queue_wait_seconds"  # histogram {class, tenant}
CLASS_TIME_TO_FIRST_TOKEN_SECONDS = "flotilla_class_time_to_first_token_seconds"  # histogram {class, tenant}
CLASS_REJECTIONS = "flotilla_class_rejections"  # counter (_total) {class, tenant, reason}
CLASS_PREEMPTIONS = "flotilla_class_preemptions"  # counter (_total) {class}
TENANT_LIMIT = "tenant_limit"  # the rejection reason of a tenant over its cap (429)


def parse_weights(text: str, *, what: str) -> dict[str, float]:
    """`interactive=8,batch=1` → {"interactive": 8.0, "batch": 1.0}; raises ValueError saying what to change."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = float("nan")
        if not sep or not name or not weight > 0 or weight == float("inf"):
            raise ValueError(f"{what}: {part!r} is not NAME=WEIGHT with a weight > 0, e.g. {INTERACTIVE}=8,{BATCH}=1")
        if name in weights:
            raise ValueError(f"{what}: {name!r} is given twice")
        weights[name] = weight
    return weights
