"""The autoscale loop's shell against the API emulator and a real Prometheus scraping a fake replica.

`autoscale_once` runs with a controlled clock, so windows are exercised without waiting for them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from flotilla_operator import credentials, types
from flotilla_operator.handlers.autoscale import autoscale_once
from flotilla_operator.kube import KubeClient
from flotilla_operator.prometheus import (
    RUNNING,
    RUNNING_BY_CLASS,
    SLOTS,
    WAITING,
    WAITING_BY_CLASS,
    PrometheusClient,
)
from flotilla_operator.reconciler import Context
from flotilla_operator.settings import OperatorSettings
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, start_http_server

from tests.support.k8s_emulator import serve
from tests.support.ports import free_port
from tests.support.prometheus import RealPrometheus, Target

ROOT = Path(__file__).resolve().parents[2]
NS, NAME, MODEL = "default", "loop", "loop-model"
log = logging.getLogger("test")


class Replica:
    """A fake server's three gauges, and the batch class's share of waiting and running, settable from the test."""

    def __init__(self) -> None:
        registry = CollectorRegistry()
        self.gauges = {n: Gauge(n, n, ["model"], registry=registry).labels(model=MODEL) for n in (WAITING, RUNNING, SLOTS)}
        self.gauges[SLOTS].set(2)
        self.batch = {n: Gauge(n, n, ["model", "class"], registry=registry).labels(MODEL, "batch")
                      for n in (WAITING_BY_CLASS, RUNNING_BY_CLASS)}
        self.port = free_port()
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple]:
    crd = yaml.safe_load((ROOT / "crds" / "flotilla.dev_inferencemodels.yaml").read_text())
    replica = Replica()
    try:
        with serve(tmp_path_factory.mktemp("k8s"), crds=[crd]) as k8s, RealPrometheus() as prom:
            prom.set_targets([Target(f"127.0.0.1:{replica.port}", {"namespace": NS, "model": MODEL, "pod": "p0"})])
            prom.wait_for("count(flotilla_slots)", lambda v: v == 1)
            yield k8s, prom, replica
    finally:
        replica.close()


def model(replicas: int, **scaling) -> dict:
    return {"apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"model": {"name": MODEL, "source": {"builtin": "tiny"}}, "replicas": replicas,
                     "placement": {"policy": "cost-first"},
                     "scaling": {"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 2,
                                 "scaleDownStabilizationSeconds": 30, **scaling},
                     "server": {"maxNumSeqs": 2, "maxBatchedTokens": 64, "prefillChunk": 64}}}


@pytest.fixture
def fresh(world):
    k8s, prom, replica = world
    for existing in k8s.list(types.API_VERSION, types.PLURAL, NS):
        k8s.delete(types.API_VERSION, types.PLURAL, existing["metadata"]["name"], NS)
    for existing in k8s.list("apps/v1", "deployments", NS):
        k8s.delete("apps/v1", "deployments", existing["metadata"]["name"], NS)
    return k8s, prom, replica


def deployment(k8s, ready: int, name: str = NAME) -> None:
    """The model's Deployment with `ready` ready replicas, as the Deployment controller would report it."""
    if k8s.get("apps/v1", "deployments", name, NS) is None:
        k8s.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
                    "spec": {"replicas": ready, "selector": {"matchLabels": {"a": "b"}},
                             "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}}})
    k8s.patch("apps/v1", "deployments", name, NS, {"status": {"readyReplicas": ready, "replicas": ready}},
              subresource="status")


async def tick(k8s, prom_url: str, now_s: float, name: str = NAME) -> dict:
    """One autoscaler decision for `name` at `now_s`; the model as it is after it."""
    kube = KubeClient(functools.partial(credentials.login, k8s.kubeconfig))
    prometheus = PrometheusClient(prom_url, timeout_s=2.0)
    try:
        ctx = Context(OperatorSettings(namespaces=(NS,)), kube, monitoring=False)
        await autoscale_once(ctx, prometheus, NS, name, log, now_s=now_s)
    finally:
        await kube.close()
        await prometheus.aclose()
    return k8s.get(types.API_VERSION, types.PLURAL, name, NS)


def sample(name: str, labels: dict[str, str]) -> float:
    """The operator's own metric, as its /metrics would show it."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def condition(obj: dict) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "ScalingActive")


def settle(prom: RealPrometheus, waiting: float, waiting_batch: float = 0) -> None:
    prom.wait_for(f'sum(flotilla_requests_waiting{{model="{MODEL}"}})', lambda v: v == waiting, timeout_s=10)
    prom.wait_for(f'sum({WAITING_BY_CLASS}{{model="{MODEL}"}})', lambda v: v == waiting_batch, timeout_s=10)


async def test_queue_scales_up_through_the_scale_subresource_and_records(fresh) -> None:
    k8s, prom, replica = fresh
    k8s.create(model(1))
    deployment(k8s, ready=1)
    replica.gauges[RUNNING].set(2)
    replica.gauges[WAITING].set(10)  # D = 12, T = 2 + 2 = 4: three replicas
    settle(prom, 10)
    decisions = {"namespace": NS, "model": MODEL, "direction": "up", "reason": "ScaleUp"}
    before = sample("flotilla_operator_autoscaler_decisions_total", decisions)
    obj = await tick(k8s, prom.url, time.time())
    assert obj["spec"]["replicas"] == 3
    auto = obj["status"]["autoscaler"]
    assert auto["lastReason"] == "ScaleUp" and "Q=10" in auto["lastDecision"] and auto["queueDepth"] == 10
    assert auto["lastScaleTime"] and [r["replicas"] for r in auto["recommendations"]] == [1, 3]
    assert condition(obj)["status"] == "True"
    assert sample("flotilla_operator_autoscaler_decisions_total", decisions) == before + 1
    assert sample("flotilla_operator_desired_replicas", {"namespace": NS, "model": MODEL}) == 3
    events = [e for e in k8s.list("v1", "events", NS) if e["involvedObject"]["uid"] == obj["metadata"]["uid"]]
    assert [e["reason"] for e in events] == ["ScaleUp"] and "1 -> 3" in events[0]["message"]


async def test_pending_replicas_hold_then_window_holds_after_restart(fresh) -> None:
    k8s, prom, replica = fresh
    k8s.create(model(1, maxReplicas=8))
    deployment(k8s, ready=1)
    replica.gauges[RUNNING].set(2)
    replica.gauges[WAITING].set(22)  # D = 24: six wanted, the rate limit allows 1 + 4
    settle(prom, 22)
    t0 = time.time()
    obj = await tick(k8s, prom.url, t0)
    assert obj["spec"]["replicas"] == 5 and obj["status"]["autoscaler"]["lastReason"] == "ScaleUpRateLimited"
    obj = await tick(k8s, prom.url, t0 + 2)  # four still starting: hold
    assert obj["spec"]["replicas"] == 5 and obj["status"]["autoscaler"]["lastReason"] == "PendingReplicas"
    deployment(k8s, ready=5)
    replica.gauges[RUNNING].set(0)
    replica.gauges[WAITING].set(0)
    settle(prom, 0)
    # a new client and context per tick: all the loop knows comes from status, as after a restart
    obj = await tick(k8s, prom.url, t0 + 20)
    assert obj["spec"]["replicas"] == 5 and obj["status"]["autoscaler"]["lastReason"] == "ScaleDownStabilizing"
    obj = await tick(k8s, prom.url, t0 + 33)  # the last high recommendation was at t0 + 2
    assert obj["spec"]["replicas"] == 1 and obj["status"]["autoscaler"]["lastReason"] == "ScaleDown"


async def test_prometheus_outage_holds_and_reports(fresh) -> None:
    k8s, prom, replica = fresh
    k8s.create(model(2))
    deployment(k8s, ready=2)
    replica.gauges[RUNNING].set(0)
    replica.gauges[WAITING].set(0)
    settle(prom, 0)
    t0 = time.time()
    await tick(k8s, prom.url, t0)
    prom.stop()
    try:
        unreachable = {"reason": "unreachable"}
        failures = sample("flotilla_operator_prometheus_query_failures_total", unreachable)
        obj = await tick(k8s, prom.url, t0 + 3600)  # long after any window: still no scale-down
        assert obj["spec"]["replicas"] == 2
        assert (condition(obj)["status"], condition(obj)["reason"]) == ("False", "MetricsUnavailable")
        assert sample("flotilla_operator_prometheus_query_failures_total", unreachable) == failures + 1
        events = k8s.list("v1", "events", NS)
        assert any(e.get("reason") == "MetricsUnavailable" and e.get("type") == "Warning" for e in events)
    finally:
        prom.start()
    prom.wait_for("count(flotilla_slots)", lambda v: v == 1)
    obj = await tick(k8s, prom.url, t0 + 3601)
    assert condition(obj)["status"] == "True"
    assert obj["spec"]["replicas"] == 1  # resumed: the window's evidence had expired


async def test_disabled_scaling_leaves_replicas_alone(fresh) -> None:
    k8s, prom, _ = fresh
    k8s.create(model(3, disabled=True))
    deployment(k8s, ready=3)
    obj = await tick(k8s, prom.url, time.time())
    assert obj["spec"]["replicas"] == 3 and "autoscaler" not in obj.get("status", {})
    assert (condition(obj)["status"], condition(obj)["reason"]) == ("False", "ScalingDisabled")


@pytest.mark.parametrize(("weight", "replicas", "reason"), [
    (None, 1, "Stable"),  # the default 0: batch work fills the one replica, never scales out
    (1.0, 3, "ScaleUp"),  # counted in full: D = 12, T = 4
])
async def test_a_batch_flood_scales_out_only_by_its_weight(fresh, weight: float | None, replicas: int,
                                                           reason: str) -> None:
    k8s, prom, replica = fresh
    k8s.create(model(1, **({} if weight is None else {"batchDemandWeight": weight})))
    deployment(k8s, ready=1)
    settings = ((replica.gauges[RUNNING], 2), (replica.gauges[WAITING], 10),  # all of it batch work
                (replica.batch[RUNNING_BY_CLASS], 2), (replica.batch[WAITING_BY_CLASS], 10))
    for gauge, value in settings:
        gauge.set(value)
    try:
        settle(prom, 10, waiting_batch=10)
        obj = await tick(k8s, prom.url, time.time())
    finally:
        for gauge, _ in settings:
            gauge.set(0)
    auto = obj["status"]["autoscaler"]
    assert (obj["spec"]["replicas"], auto["lastReason"]) == (replicas, reason), auto["lastDecision"]
    assert "Rb=2 Qb=10" in auto["lastDecision"] and auto["queueDepth"] == 10  # queueDepth: every waiting request
