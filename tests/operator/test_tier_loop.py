"""The tiering tick against the API emulator and a real Prometheus scraping a fake pool server.

The fake server exports what a pool pod exports for two members (the queue gauges labelled `model`, and the
evictions counter), scraped with the `pool` label a pool pod's ServiceMonitor gives, so tier_prometheus.py's
subquery, eviction and pool-demand PromQL run for real. `tier_once` then runs: a model whose demand holds over
the window starts a promotion (status.move, spec.replicas, an Event, its Deployment beside its pool membership);
a Prometheus that does not answer changes nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from flotilla_contract.metrics import MODEL_EVICTIONS, REQUESTS_RUNNING, REQUESTS_WAITING, SLOTS
from flotilla_operator import credentials, tier_prometheus, types
from flotilla_operator.kube import KubeClient
from flotilla_operator.pool_manifests import pool_selector
from flotilla_operator.prometheus import PrometheusClient
from flotilla_operator.reconciler import Context
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.tier_mover import tier_once
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tests.operator.test_autoscaler_loop import NS, ROOT
from tests.support.k8s_emulator import serve
from tests.support.ports import free_port
from tests.support.prometheus import RealPrometheus, Target

NAME, OTHER, POOL = "hot", "cold", "shared"
WINDOW_S = 4


class PoolServer:
    """A fake pool pod: each member's queue gauges and evictions, as a multi-model server exports them."""

    def __init__(self) -> None:
        registry = CollectorRegistry()
        self.gauges = {name: Gauge(name, name, ["model"], registry=registry)
                       for name in (REQUESTS_RUNNING, REQUESTS_WAITING, SLOTS)}
        for model in (NAME, OTHER):
            self.gauges[SLOTS].labels(model=model).set(4)
        self.evictions = Counter(MODEL_EVICTIONS, "evictions", ["model"], registry=registry)
        self.port = free_port()
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    def set(self, model: str, running: float, waiting: float) -> None:
        self.gauges[REQUESTS_RUNNING].labels(model=model).set(running)
        self.gauges[REQUESTS_WAITING].labels(model=model).set(waiting)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple]:
    crds = [yaml.safe_load((ROOT / "crds" / f"flotilla.dev_{plural}.yaml").read_text())
            for plural in ("inferencemodels", "modelpools")]
    server = PoolServer()
    try:
        with serve(tmp_path_factory.mktemp("k8s"), crds=crds) as k8s, RealPrometheus() as prom:
            prom.set_targets([Target(f"127.0.0.1:{server.port}", {"namespace": NS, "pod": "shared-pool-0",
                                                                   "pool": POOL})])
            prom.wait_for("count(flotilla_slots)", lambda v: v == 2)
            yield k8s, prom, server
    finally:
        server.close()


@pytest.fixture
def fresh(world):
    """The world without the objects an earlier test made (the tests run in any order)."""
    k8s = world[0]
    for api_version, plural in ((types.API_VERSION, "inferencemodels"), (types.API_VERSION, "modelpools"),
                                ("apps/v1", "deployments"), ("v1", "pods"), ("v1", "configmaps")):
        for existing in k8s.list(api_version, plural, NS):
            k8s.delete(api_version, plural, existing["metadata"]["name"], NS)
    return world


def adaptive(tiering: dict | None = None) -> dict:
    return {"apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"model": {"name": NAME, "source": {"builtin": "tiny"}}, "placement": {"policy": "adaptive"},
                     "pool": POOL, "replicas": 1, "scaling": {"minReplicas": 1, "maxReplicas": 3},
                     "server": {"maxNumSeqs": 2, "maxBatchedTokens": 64, "prefillChunk": 64},
                     "tiering": {"windowSeconds": WINDOW_S, "minStaySeconds": 0, **(tiering or {})}}}


async def tick(k8s, prom_url: str) -> dict:
    kube = KubeClient(functools.partial(credentials.login, k8s.kubeconfig))
    prometheus = PrometheusClient(prom_url, timeout_s=2.0)
    try:
        ctx = Context(OperatorSettings(namespaces=(NS,), autoscale_interval_s=1.0), kube, monitoring=False)
        await tier_once(ctx, prometheus, NS, NAME, logging.getLogger("test"))
    finally:
        await kube.close()
        await prometheus.aclose()
    return k8s.get(types.API_VERSION, types.PLURAL, NAME, NS)


def wait_for_window(prom: RealPrometheus) -> None:
    """Until the demand has been scraped at 2 over a whole window (1 s scrapes)."""
    prom.wait_for(f'count_over_time((flotilla_requests_waiting{{model="{NAME}"}} == 2)[{WINDOW_S + 2}s:1s])',
                  lambda v: v >= WINDOW_S + 2, timeout_s=WINDOW_S + 15)


async def test_the_window_of_demand_is_read_back_from_prometheus(world) -> None:
    _, prom, server = world
    server.set(NAME, running=2, waiting=2)  # 4 requests: two replicas' worth of maxNumSeqs 2
    server.set(OTHER, running=1, waiting=0)
    server.evictions.labels(model=NAME).inc(3)
    wait_for_window(prom)
    client = PrometheusClient(prom.url)
    try:
        samples = await tier_prometheus.read_samples(client, NS, NAME, 2, WINDOW_S, 1.0, 0.97)
        other = await tier_prometheus.read_pool_demand(client, NS, POOL, NAME, 4)
    finally:
        await client.aclose()
    now = time.time()
    assert samples[0].at_s <= now - WINDOW_S + 1 and samples[-1].at_s > now - 3  # the whole window, up to now
    assert {s.demand_replicas for s in samples} == {2.0}
    assert samples[-1].attainment == 0.97 and samples[-1].cold_loads >= 0  # increase() extrapolates
    assert other == pytest.approx(0.25)  # the other member's 1 request over the pool's 4 slots


async def test_sustained_demand_in_the_pool_starts_a_promotion_and_an_outage_changes_nothing(fresh) -> None:
    k8s, prom, server = fresh
    k8s.create({"apiVersion": types.API_VERSION, "kind": "ModelPool", "metadata": {"name": POOL, "namespace": NS},
                "spec": {"memoryBudget": "1Gi", "replicas": 1}})
    k8s.create(adaptive())
    server.set(NAME, running=2, waiting=2)
    wait_for_window(prom)
    dead = await tick(k8s, "http://127.0.0.1:9")  # nothing listens: hold, write nothing
    assert "tier" not in (dead.get("status") or {})
    obj = await tick(k8s, prom.url)
    status = obj["status"]
    assert "move" in status, status["tiering"]
    assert status["tier"] == "pool" and status["move"]["to"] == "dedicated" and status["move"]["phase"] == "Starting"
    assert status["move"]["reason"] == "SustainedDemand" and status["move"]["replicas"] == 2
    assert obj["spec"]["replicas"] == 2  # the promotion sizes the Deployment from the demand
    assert status["tiering"]["reason"] == "SustainedDemand" and len(status["tiering"]["moves"]) == 1
    deployment = k8s.get("apps/v1", "deployments", NAME, NS)
    assert deployment is not None and deployment["spec"]["replicas"] == 2  # made before the pool lets go
    members = k8s.get("v1", "configmaps", f"{POOL}-pool-members", NS)
    assert members is not None and f"{NAME}=tiny" in "".join(members["data"].values())
    events = [e["reason"] for e in k8s.list("v1", "events", NS) if e["involvedObject"]["name"] == NAME]
    assert "PromotionStarted" in events
    # the next tick waits in Starting: no replica is ready yet
    again = await tick(k8s, prom.url)
    assert again["status"]["move"] == status["move"]


class LoadReport(BaseHTTPRequestHandler):
    """A pool pod's load report: the model listed, larger than the pod's memory budget."""

    def do_GET(self) -> None:
        body = json.dumps({"ready": True, "waiting": 0, "running": 0, "slots": 4, "queue_capacity": 32,
                           "kv_usage": 0.0, "memory_budget_bytes": 1000,
                           "models": [{"name": NAME, "state": "available", "memory_bytes": 5000}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


async def test_a_pool_that_cannot_hold_the_model_sends_it_to_dedicated_replicas_degraded(fresh) -> None:
    k8s, prom, _ = fresh
    report = ThreadingHTTPServer(("127.0.0.1", free_port()), LoadReport)
    threading.Thread(target=report.serve_forever, daemon=True).start()
    try:
        k8s.create({"apiVersion": types.API_VERSION, "kind": "ModelPool", "metadata": {"name": POOL, "namespace": NS},
                    "spec": {"memoryBudget": "1000", "replicas": 1}})
        k8s.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "shared-pool-0", "namespace": NS, "labels": pool_selector(POOL)},
                    "spec": {"containers": [{"name": "server", "ports": [
                        {"name": "http", "containerPort": report.server_address[1]}]}]}})
        k8s.patch("v1", "pods", "shared-pool-0", NS, {"status": {"phase": "Running", "podIP": "127.0.0.1"}},
                  subresource="status")
        k8s.create(adaptive({"minStaySeconds": 3600}))  # no bound holds this move
        obj = await tick(k8s, prom.url)
        status = obj["status"]
        assert status["move"]["to"] == "dedicated" and status["move"]["reason"] == "PoolCannotHold", status
        assert status["tiering"]["degraded"]["reason"] == "PoolCannotHold"
        assert "cannot hold the model (5000 bytes" in status["tiering"]["degraded"]["message"]
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "PoolCannotHold")
        assert k8s.get("apps/v1", "deployments", NAME, NS) is not None
    finally:
        report.shutdown()
        report.server_close()
