"""Evaluate dashboard panel queries against a real Prometheus, the way Grafana would for one selection of
the dashboard's variables (variable queries included).

Used by e2e/test_dashboards.py (the fleet and model dashboards, over the whole loop) and by
tests/server/model_cache/test_multimodel_server.py (the pool dashboard, over a real multi-model server).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import httpx

from tests.chart.dashboard_queries import PanelQuery, queries, substitute, variables
from tests.support.prometheus import RealPrometheus

WINDOW_S = 30  # the range each query is evaluated over, as a dashboard's recent time range


def series_values(prometheus: RealPrometheus, expr: str) -> tuple[str | None, list[float]]:
    """(error, every value of every series) of a range query over the last WINDOW_S seconds."""
    end = time.time()
    response = httpx.get(f"{prometheus.url}/api/v1/query_range",
                         params={"query": expr, "start": end - WINDOW_S, "end": end, "step": "2s"}, timeout=10)
    body = response.json()
    if body.get("status") != "success":
        return body.get("error", response.text), []
    return None, [float(v) for series in body["data"]["result"] for _, v in series["values"]]


def label_values(prometheus: RealPrometheus, definition: str) -> list[str]:
    """Grafana's `label_values(selector, label)` variable query, through Prometheus' series API."""
    inner = definition.removeprefix("label_values(").removesuffix(")")
    selector, label = (part.strip() for part in inner.rsplit(",", 1))
    response = httpx.get(f"{prometheus.url}/api/v1/series", params={"match[]": selector}, timeout=10)
    response.raise_for_status()
    return sorted({s[label] for s in response.json()["data"] if label in s})


def selection(prometheus: RealPrometheus, dashboard: dict) -> tuple[dict[str, str], list[str]]:
    """Values for the dashboard's variables, in order (each may use the previous), and the variables with none."""
    chosen: dict[str, str] = {"datasource": "prometheus"}
    empty = []
    for variable in variables(dashboard):
        if variable["type"] != "query":
            continue
        options = label_values(prometheus, substitute(variable["definition"], chosen))
        if not options:
            empty.append(variable["name"])
        chosen[variable["name"]] = variable["allValue"] if variable.get("includeAll") else (options or ["none"])[0]
    return chosen, empty


def failing_queries(prometheus: RealPrometheus, dashboards: Iterable[dict], must_be_nonzero: set[str]) -> list[str]:
    """Every query that errors or has no finite value, and every panel of `must_be_nonzero` with only zeros."""
    failures = []
    for dashboard in dashboards:
        chosen, empty = selection(prometheus, dashboard)
        failures += [f"{dashboard['title']} / variable ${name}: label_values returned nothing" for name in empty]
        query: PanelQuery
        for query in queries(dashboard):
            error, values = series_values(prometheus, substitute(query.expr, chosen))
            if error:
                failures.append(f"{query.name}: error {error}")
            elif not any(math.isfinite(v) for v in values):
                failures.append(f"{query.name}: no data ({len(values)} values, none finite)")
            elif query.panel in must_be_nonzero and not any(v > 0 for v in values if math.isfinite(v)):
                failures.append(f"{query.name}: only zeros, although the load produces these events")
    return failures
