"""The Grafana dashboards: fixed uids, a datasource variable, model/namespace selectors, queries that parse
and use only series that the server and the operator export. e2e/test_dashboards.py runs them for real."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from tests.chart.dashboard_queries import (
    load_dashboards,
    metric_names,
    panels,
    queries,
    substitute,
    variables,
)

DASHBOARDS = load_dashboards()
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


SERIES_SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Series names as Prometheus stores them: counters gain _total, histograms _bucket/_sum/_count."""
    return {f.name + s for f in registry.collect() for s in SERIES_SUFFIXES[f.type]}


def system_series() -> set[str]:
    from flotilla_gateway.metrics import GatewayMetrics
    from flotilla_operator import metrics as operator_metrics
    from flotilla_server.http.metrics import ServerMetrics, StateSnapshot
    from flotilla_server.http.pool_metrics import PoolMetrics

    server = ServerMetrics("m", lambda: StateSnapshot(0, 0, 1, 1, 0, 0))
    pool = PoolMetrics(lambda: [])  # a multi-model server's own series
    operator = CollectorRegistry()
    for collector in vars(operator_metrics).values():
        if isinstance(collector, MetricWrapperBase):
            operator.register(collector)
    return (exported_names(server.registry) | exported_names(pool.registry) | exported_names(operator)
            | exported_names(GatewayMetrics().registry))


def test_dashboards_have_fixed_uids_and_titles() -> None:
    assert {name: d["uid"] for name, d in DASHBOARDS.items()} == {
        "flotilla-fleet.json": "flotilla-fleet", "flotilla-model.json": "flotilla-model",
        "flotilla-pool.json": "flotilla-pool"}
    assert {d["title"] for d in DASHBOARDS.values()} == {"Flotilla fleet", "Flotilla model", "Flotilla pool"}
    assert all("id" not in d or d["id"] is None for d in DASHBOARDS.values())


# A multi-model server's own series, one per pod with no `model` label: the pool dashboard selects them by
# its `pool` variable, and by model only where a series has one.
POOL_SERIES_WITHOUT_MODEL = {"flotilla_models_resident", "flotilla_model_lru_age_seconds",
                             "flotilla_model_load_seconds_bucket", "flotilla_model_load_seconds_sum",
                             "flotilla_model_load_seconds_count"}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_datasource_variable_and_selectors(name: str) -> None:
    by_name = {v["name"]: v for v in variables(DASHBOARDS[name])}
    assert by_name["datasource"]["type"] == "datasource" and by_name["datasource"]["query"] == "prometheus"
    pool = name == "flotilla-pool.json"
    for selector in ("namespace", "model", *(("pool",) if pool else ())):
        assert by_name[selector]["type"] == "query"
        assert by_name[selector]["datasource"] == DATASOURCE
    for panel in panels(DASHBOARDS[name]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"] == DATASOURCE, panel["title"]
            if not (pool and metric_names(expr) <= POOL_SERIES_WITHOUT_MODEL):
                assert 'model=~"$model"' in expr, f"{panel['title']}: query ignores the model selector"
            assert 'namespace=~"$namespace"' in expr, f"{panel['title']}: ignores the namespace selector"
            if pool:
                assert expr.count('pool=~"$pool"') == len(re.findall(r"\bflotilla_\w+\{", expr)), \
                    f"{panel['title']}: a series ignores the pool selector"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panel_ids_unique_and_grid_does_not_overlap(name: str) -> None:
    all_panels = list(panels(DASHBOARDS[name]))
    assert len({p["id"] for p in all_panels}) == len(all_panels)
    cells: dict[tuple[int, int], str] = {}
    for p in all_panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_fleet_dashboard_has_the_required_panels() -> None:
    fleet = DASHBOARDS["flotilla-fleet.json"]
    exprs: dict[str, str] = {}
    for q in queries(fleet):
        exprs[q.panel] = exprs.get(q.panel, "") + q.expr
    required = {
        "Replicas: desired and ready": "flotilla_operator_ready_replicas",
        "Queue depth": "flotilla_requests_waiting",
        "Running requests": "flotilla_requests_running",
        "429/s by reason": "queue_full|queue_timeout",
        "499/s by reason": "client_gone|slow_client",
        "Time to first token": "flotilla_time_to_first_token_seconds_bucket",
        "Inter-token latency p95": "histogram_quantile(0.95",
        "Output tokens/s": "flotilla_generation_tokens_total",
        "KV cache usage": "flotilla_kv_cache_usage_ratio",
        "Autoscaler decisions": "flotilla_operator_autoscaler_decisions_total",
        "Held requests": "flotilla_gateway_requests_held",
        "Hold time": "flotilla_gateway_hold_seconds_bucket",
        "Routing decisions/s": "flotilla_gateway_routing_decision_seconds_count",
        "Per-pod load as the gateway sees it": "flotilla_gateway_pod_load",
        "Gateway retries/s by reason": "flotilla_gateway_upstream_retries_total",
    }
    for panel, needle in required.items():
        assert needle in exprs[panel], panel
    ttft = [q.expr for q in queries(fleet) if q.panel == "Time to first token"]
    assert [e.split(",")[0] for e in ttft] == [f"histogram_quantile({q}" for q in ("0.5", "0.95", "0.99")]


def test_pool_dashboard_has_the_pool_panels() -> None:
    """Residency, evictions, load time quantiles, LRU age against the thrash alert's line, engine deaths."""
    pool = DASHBOARDS["flotilla-pool.json"]
    exprs: dict[str, str] = {}
    for q in queries(pool):
        exprs[q.panel] = exprs.get(q.panel, "") + q.expr
    required = {
        "Resident models per pod": "flotilla_models_resident",
        "Models by state": "flotilla_model_state",
        "Evictions/s by model": "flotilla_model_evictions_total",
        "Load time": "flotilla_model_load_seconds_bucket",
        "LRU age and 10x mean load time": "flotilla_model_lru_age_seconds",
        "Engine deaths": "flotilla_model_engine_deaths_total",
        "Requests/s by outcome": "flotilla_model_requests_total",
    }
    for panel, needle in required.items():
        assert needle in exprs[panel], panel
    load = [q.expr for q in queries(pool) if q.panel == "Load time"]
    assert [e.split(",")[0] for e in load] == [f"histogram_quantile({q}" for q in ("0.5", "0.95", "0.99")]
    assert "10 * (" in exprs["LRU age and 10x mean load time"]  # the thrash alert's threshold, drawn


def test_model_dashboard_breaks_down_by_pod() -> None:
    model = DASHBOARDS["flotilla-model.json"]
    titles = {q.panel for q in queries(model)}
    assert {"Step duration", "Tokens per step", "Queue wait", "Preemptions/s by pod"} <= titles
    assert any(v["name"] == "pod" for v in variables(model))
    assert sum("by (pod)" in q.expr for q in queries(model)) >= 5


def test_model_dashboard_has_a_row_per_request_class() -> None:
    """One row, repeated by Grafana for each value of $class (the class gauges' `class` label), whose panels
    each select that class: waiting and running, queue wait and TTFT p95, rejections by reason, preemptions."""
    from flotilla_contract import classes

    model = DASHBOARDS["flotilla-model.json"]
    (row,) = [p for p in model["panels"] if p["type"] == "row" and p.get("repeat") == "class"]
    class_var = next(v for v in variables(model) if v["name"] == "class")
    assert class_var["includeAll"] and class_var["multi"] and class_var["current"]["value"] == ["$__all"]
    assert classes.CLASS_REQUESTS_WAITING in class_var["definition"]
    after = [p for p in model["panels"] if p["gridPos"]["y"] > row["gridPos"]["y"]]
    assert after and all(p["type"] != "row" for p in after)  # the repeated row is the last: it takes them all
    exprs: dict[str, str] = {}
    for q in queries(model):
        if q.panel in {p["title"] for p in after}:
            assert 'class=~"$class"' in q.expr, q.name
            exprs[q.panel] = exprs.get(q.panel, "") + q.expr
    required = {
        "Waiting and running by class": f"{classes.CLASS_REQUESTS_WAITING}{{.*{classes.CLASS_REQUESTS_RUNNING}{{",
        "Queue wait p95 by class": rf"histogram_quantile\(0.95, sum by \(class, le\) \(rate\({classes.CLASS_QUEUE_WAIT_SECONDS}_bucket",
        "Time to first token p95 by class": rf"histogram_quantile\(0.95, .*{classes.CLASS_TIME_TO_FIRST_TOKEN_SECONDS}_bucket",
        "Rejections/s by class and reason": rf"sum by \(class, reason\).*reason=\"{classes.TENANT_LIMIT}\"",
        "Preemptions/s by class": rf"sum by \(class\) \(rate\({classes.CLASS_PREEMPTIONS}_total",
    }
    assert set(exprs) == set(required)
    for panel, pattern in required.items():
        assert re.search(pattern, exprs[panel]), panel


def test_queries_use_only_series_the_system_exports() -> None:
    exported = system_series()
    for dashboard in DASHBOARDS.values():
        for q in queries(dashboard):
            unknown = metric_names(q.expr) - exported
            assert not unknown, f"{q.name} queries {sorted(unknown)}, which neither server nor operator exports"
        for v in variables(dashboard):
            if v["type"] == "query":
                assert metric_names(v["definition"]) <= exported, v["name"]


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool parses each query (variables substituted) as a recording rule: a syntax error names the panel."""
    rules = []
    for dashboard in DASHBOARDS.values():
        for i, q in enumerate(queries(dashboard)):
            expr = substitute(q.expr, {"datasource": "prometheus", "namespace": ".*", "model": ".*", "pod": ".*",
                                       "pool": ".*", "class": ".*"})
            rules.append({"record": f"dashboard:{dashboard['uid'].replace('-', '_')}:{i}", "expr": expr,
                          "labels": {"panel": q.name}})
    rules_file = tmp_path / "dashboard-queries.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_substitute_refuses_an_unknown_variable() -> None:
    assert substitute('rate(x{m=~"$model"}[$__rate_interval])', {"model": "a"}) == 'rate(x{m=~"a"}[1m])'
    with pytest.raises(KeyError, match="nope"):
        substitute("up{a=\"$nope\"}", {})
