"""Residency (docs/pools.md): which pool pods hold which member, from the servers' load reports."""

from __future__ import annotations

import asyncio

import pytest
from flotilla_contract.load import ModelLoad, ServerLoad
from flotilla_operator.pool_residency import load_url, read_loads, residency

from tests.server.http.server_process import run_server


def load(*models: tuple[str, str]) -> ServerLoad:
    return ServerLoad(ready=True, waiting=0, running=0, slots=8, queue_capacity=64, kv_usage=0.0,
                      models=[ModelLoad(name=name, state=state) for name, state in models])  # type: ignore[arg-type]


@pytest.mark.parametrize(("reports", "pods_by_model", "count"), [
    ({}, {}, 0),
    ({"p0": None}, {}, 0),  # a pod that did not answer holds nothing
    ({"p0": load(("a", "loaded"), ("b", "loading"), ("c", "available"))}, {"a": ("p0",)}, 1),  # only loaded holds
    ({"p1": load(("a", "loaded")), "p0": load(("a", "loaded"), ("b", "loaded"))},
     {"a": ("p0", "p1"), "b": ("p0",)}, 3),  # two copies of a; pods sorted
])
def test_residency_table(reports, pods_by_model, count):
    resident = residency(reports)
    assert resident.pods_by_model == pods_by_model
    assert resident.resident_count == count
    assert resident.pods_holding("absent") == []


@pytest.mark.parametrize(("pod", "url"), [
    ({"status": {"phase": "Pending", "podIP": "10.0.0.1"}}, None),
    ({"status": {"phase": "Running"}}, None),
    ({"status": {"phase": "Running", "podIP": "10.0.0.1"}}, "http://10.0.0.1:8000/flotilla/v1/load"),
    ({"status": {"phase": "Running", "podIP": "10.0.0.1"},
      "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 9000}]}]}}, "http://10.0.0.1:9000/flotilla/v1/load"),
])
def test_load_url_asks_running_pods_on_their_http_port(pod, url):
    assert load_url(pod) == url


def test_read_loads_asks_a_real_server_and_skips_a_silent_pod(tmp_path):
    with run_server("--max-num-seqs", "4", tmp_path=tmp_path) as server:
        port = int(server.base_url.rsplit(":", 1)[1])
        running = {"status": {"phase": "Running", "podIP": "127.0.0.1"},
                   "spec": {"containers": [{"ports": [{"name": "http", "containerPort": port}]}]}}
        pods = [{"metadata": {"name": "up"}, **running},
                {"metadata": {"name": "silent"}, "status": {"phase": "Running", "podIP": "127.0.0.1"},
                 "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 1}]}]}}]
        reports = asyncio.run(read_loads(pods, timeout_s=5.0))
    assert reports["silent"] is None
    assert residency(reports).pods_by_model == {"tiny": ("up",)}
