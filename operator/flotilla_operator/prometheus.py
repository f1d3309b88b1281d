"""The autoscaler's window on Prometheus: one PromQL query for a model's pool-wide queue, with timeouts.

Every failure becomes a `PrometheusError` whose `reason` is a small fixed word (for the
`flotilla_operator_prometheus_query_failures_total` counter) and whose message says what to check.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from flotilla_contract.classes import BATCH, CLASS_LABEL, CLASS_REQUESTS_RUNNING, CLASS_REQUESTS_WAITING
from flotilla_contract.metrics import GATEWAY_REQUESTS_HELD

DEFAULT_TIMEOUT_S = 5.0

WAITING = "flotilla_requests_waiting"
RUNNING = "flotilla_requests_running"
SLOTS = "flotilla_slots"
WAITING_BY_CLASS = CLASS_REQUESTS_WAITING  # {class}: of WAITING, by request class
RUNNING_BY_CLASS = CLASS_REQUESTS_RUNNING

# Failure reasons (label values of PROMETHEUS_QUERY_FAILURES).
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
HTTP_ERROR = "http_error"
QUERY_ERROR = "query_error"
BAD_RESPONSE = "bad_response"


class PrometheusError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PoolSample:
    """Pool-wide sums for one model at one instant."""

    waiting: float
    running: float
    slots: float  # summed over replicas
    replicas_reporting: int  # replicas with a flotilla_slots series
    held: float = 0.0  # P: requests flotilla-gateway replicas hold for the model (summed over replicas)
    waiting_batch: float = 0.0  # of `waiting`, class batch; 0 when no server exports the class gauges
    running_batch: float = 0.0

    @property
    def slots_per_replica(self) -> float | None:
        return self.slots / self.replicas_reporting if self.replicas_reporting else None


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def batch_parts(selector: str) -> list[tuple[str, str]]:
    """The batch class's waiting and running sums under `selector` (a `{...}` label matcher, without class)."""
    batch = selector[:-1] + f',{CLASS_LABEL}="{BATCH}"}}'
    return [("waiting_batch", f"sum({WAITING_BY_CLASS}{batch})"), ("running_batch", f"sum({RUNNING_BY_CLASS}{batch})")]


def model_selector(namespace: str, model: str) -> str:
    """The label matcher of one model's server series: `{namespace="...",model="..."}`."""
    return f'{{namespace="{_label_value(namespace)}",model="{_label_value(model)}"}}'


def pool_query(namespace: str, model: str) -> str:
    """One PromQL expression evaluating every sum at the same instant, each tagged `part`."""
    selector = model_selector(namespace, model)
    # gateway series carry the model's namespace as model_namespace (`namespace` is the gateway's own)
    held_selector = f'{{model_namespace="{_label_value(namespace)}",model="{_label_value(model)}"}}'
    parts = [
        ("waiting", f"sum({WAITING}{selector})"),
        ("running", f"sum({RUNNING}{selector})"),
        ("slots", f"sum({SLOTS}{selector})"),
        ("replicas", f"count({SLOTS}{selector})"),
        ("held", f"sum({GATEWAY_REQUESTS_HELD}{held_selector})"),
        *batch_parts(selector),
    ]
    return labelled_union(parts)


def labelled_union(parts: list[tuple[str, str]]) -> str:
    """One query for several expressions: each result row labelled `part` with its expression's name."""
    return " or ".join(f'label_replace({expr}, "part", "{name}", "", "")' for name, expr in parts)


def vector_rows(body: object) -> list:
    """The rows of a /api/v1/query answer of type vector; ValueError (or KeyError, TypeError) on another shape."""
    if not isinstance(body, dict) or body.get("status") != "success":
        raise ValueError("status is not success")
    data = body["data"]
    if data["resultType"] != "vector":
        raise ValueError(f"resultType {data['resultType']!r} is not vector")
    return data["result"]


def bad_shape(body: object, error: Exception) -> PrometheusError:
    return PrometheusError(BAD_RESPONSE, f"Prometheus answered in an unexpected shape ({error}): {body!r:.300}")


def parse_pool(body: object) -> PoolSample:
    """The sample from a /api/v1/query answer to `pool_query`; absent parts mean no series (zero)."""
    try:
        values = {r["metric"]["part"]: float(r["value"][1]) for r in vector_rows(body)}
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise bad_shape(body, e) from e
    return PoolSample(
        waiting=values.get("waiting", 0.0),
        running=values.get("running", 0.0),
        slots=values.get("slots", 0.0),
        replicas_reporting=int(values.get("replicas", 0)),
        held=values.get("held", 0.0),
        waiting_batch=values.get("waiting_batch", 0.0),
        running_batch=values.get("running_batch", 0.0),
    )


class PrometheusClient:
    """Queries the HTTP API at `base_url` (the operator's --prometheus-url)."""

    def __init__(self, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"--prometheus-url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def query(self, promql: str) -> object:
        url = f"{self.base_url}/api/v1/query"
        try:
            response = await self._client.get(url, params={"query": promql})
        except httpx.TimeoutException as e:
            raise PrometheusError(TIMEOUT, f"Prometheus at {self.base_url} did not answer within "
                                  f"{self.timeout_s:g}s; check that it is up and not overloaded") from e
        except httpx.HTTPError as e:
            raise PrometheusError(UNREACHABLE, f"cannot reach Prometheus at {self.base_url} ({e!r}); "
                                  "check --prometheus-url and that Prometheus is running") from e
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code in (400, 422) and isinstance(body, dict):
            raise PrometheusError(QUERY_ERROR, f"Prometheus rejected the query: {body.get('error')} ({promql})")
        if response.status_code != 200 or body is None:
            raise PrometheusError(HTTP_ERROR, f"Prometheus at {url} answered HTTP {response.status_code}: "
                                  f"{response.text[:200]!r}; check that --prometheus-url points at Prometheus")
        return body

    async def pool(self, namespace: str, model: str) -> PoolSample:
        """Pool-wide waiting, running and slots for `model` (the served name) in `namespace`."""
        return parse_pool(await self.query(pool_query(namespace, model)))
