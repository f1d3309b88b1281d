"""The pool autoscaler's window on Prometheus: the pool's aggregate queue, held requests and active members.

Series of a pool's servers carry `pool` (the pool's ServiceMonitor copies the pods' `flotilla.dev/model-pool`
label into it) and `model` (each series' member, exported by the server). Held requests are the gateway's
`flotilla_gateway_requests_held` for the members' names. A member is *active* when it had a request running,
waiting or held at any scrape in the demand window (docs/pools.md, "Scaling").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flotilla_contract.metrics import (
    GATEWAY_REQUESTS_HELD,
    MODEL_NAMESPACE_LABEL,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SLOTS,
)

from flotilla_operator.pool_manifests import POOL_SERIES_LABEL
from flotilla_operator.prometheus import (
    PoolSample,
    PrometheusClient,
    bad_shape,
    batch_parts,
    labelled_union,
    parse_pool,
)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _members_regex(models: Iterable[str]) -> str:
    escaped = ["".join("\\\\" + c if c in ".^$*+?()[]{}|\\" else c for c in m) for m in sorted(models)]
    return "|".join(escaped) or "$^"  # no members: matches nothing


def pool_selector(namespace: str, pool: str) -> str:
    return f"{{namespace={_quoted(namespace)},{POOL_SERIES_LABEL}={_quoted(pool)}}}"


def held_selector(namespace: str, models: Iterable[str]) -> str:
    return f'{{{MODEL_NAMESPACE_LABEL}={_quoted(namespace)},model=~"{_members_regex(models)}"}}'


def aggregate_query(namespace: str, pool: str, models: Iterable[str]) -> str:
    """The pool's sums at one instant (waiting, running, slots, replicas, held, batch), each tagged `part`."""
    servers, held = pool_selector(namespace, pool), held_selector(namespace, models)
    parts = [
        ("waiting", f"sum({REQUESTS_WAITING}{servers})"),
        ("running", f"sum({REQUESTS_RUNNING}{servers})"),
        ("slots", f"sum({SLOTS}{servers})"),
        ("replicas", f"count(count by (pod) ({SLOTS}{servers}))"),  # a pod exports slots once per model
        ("held", f"sum({GATEWAY_REQUESTS_HELD}{held})"),
        *batch_parts(servers),
    ]
    return labelled_union(parts)


def active_query(namespace: str, pool: str, models: Iterable[str], window_s: int) -> str:
    """Members with a request running, waiting or held at any scrape of the last `window_s` seconds."""
    models = list(models)
    servers, held = pool_selector(namespace, pool), held_selector(namespace, models)
    window = f"[{int(window_s)}s]"
    return " or ".join(
        f"max by (model) (max_over_time({metric}{selector}{window})) > 0"
        for metric, selector in ((REQUESTS_RUNNING, servers), (REQUESTS_WAITING, servers), (GATEWAY_REQUESTS_HELD, held))
    )


@dataclass(frozen=True)
class PoolDemand:
    sample: PoolSample  # the servers' sums
    held: float  # requests the gateway holds for the members
    active_models: frozenset[str]


def parse_active(body: object) -> frozenset[str]:
    try:
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ValueError("status is not success")
        return frozenset(r["metric"]["model"] for r in body["data"]["result"] if "model" in r["metric"])
    except (KeyError, TypeError, ValueError) as e:
        raise bad_shape(body, e) from e


def parse_held(body: object) -> float:
    if isinstance(body, dict):
        for r in (body.get("data") or {}).get("result") or []:
            if r.get("metric", {}).get("part") == "held":
                return float(r["value"][1])
    return 0.0


async def measure_pool(prometheus: PrometheusClient, namespace: str, pool: str, models: list[str],
                       window_s: int) -> PoolDemand:
    """Two queries: the aggregate now, and who was active in the window."""
    body = await prometheus.query(aggregate_query(namespace, pool, models))
    active = parse_active(await prometheus.query(active_query(namespace, pool, models, window_s)))
    return PoolDemand(parse_pool(body), parse_held(body), active & frozenset(models))
