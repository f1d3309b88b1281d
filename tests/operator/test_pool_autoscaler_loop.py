"""The pool autoscaler's shell against the API emulator and a real Prometheus scraping a fake pool replica.

The replica exports per-member gauges labelled as the pool's scrape labels them (`pool`, `model`);
`autoscale_pool_once` runs with a controlled clock. Pure rules are tested in test_pool_autoscaler.py.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator

import pytest
from flotilla_contract.classes import CLASS_REQUESTS_RUNNING, CLASS_REQUESTS_WAITING
from flotilla_contract.metrics import GATEWAY_REQUESTS_HELD, REQUESTS_RUNNING, REQUESTS_WAITING, SLOTS
from flotilla_operator import credentials, pool_types, rfc3339, types
from flotilla_operator.handlers.pool_autoscale import autoscale_pool_once
from flotilla_operator.kube import KubeClient
from flotilla_operator.pool_prometheus import measure_pool
from flotilla_operator.prometheus import PrometheusClient
from flotilla_operator.reconciler import Context
from flotilla_operator.settings import OperatorSettings
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.support.examples import crd, pool_crd
from tests.support.k8s_emulator import serve
from tests.support.ports import free_port
from tests.support.prometheus import RealPrometheus, Target

NS, POOL = "default", "loop-pool"
MEMBERS = ("m1", "m2", "m3", "m4")
NOW = 1_800_000_000.0
log = logging.getLogger("test")


class PoolReplica:
    """One fake multi-model server: waiting, running and slots per member; and a gateway's held requests."""

    def __init__(self) -> None:
        registry = CollectorRegistry()
        self.gauges = {name: Gauge(name, name, ["model"], registry=registry) for name in (REQUESTS_WAITING, REQUESTS_RUNNING, SLOTS)}
        for model in MEMBERS:
            for name, gauge in self.gauges.items():
                gauge.labels(model=model).set(2 if name == SLOTS else 0)
        self.held = Gauge(GATEWAY_REQUESTS_HELD, "held", ["model", "model_namespace"], registry=registry)
        self.by_class = {name: Gauge(name, name, ["model", "class"], registry=registry)
                         for name in (CLASS_REQUESTS_WAITING, CLASS_REQUESTS_RUNNING)}
        self.port = free_port()
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple]:
    replica = PoolReplica()
    try:
        with serve(tmp_path_factory.mktemp("k8s"), crds=[crd(), pool_crd()]) as k8s, RealPrometheus() as prom:
            prom.set_targets([Target(f"127.0.0.1:{replica.port}", {"namespace": NS, "pool": POOL, "pod": "p0"})])
            prom.wait_for("count(flotilla_slots)", lambda v: v == len(MEMBERS))
            yield k8s, prom, replica
    finally:
        replica.close()


def pool(replicas: int) -> dict:
    # budget 1Gi per replica, 512Mi per member: two members fit one replica
    return {"apiVersion": types.API_VERSION, "kind": pool_types.KIND, "metadata": {"name": POOL, "namespace": NS},
            "spec": {"replicas": replicas, "memoryBudget": "1Gi", "modelMemory": "512Mi",
                     "scaling": {"minReplicas": 0, "maxReplicas": 4, "targetQueueDepth": 100,
                                 "scaleDownStabilizationSeconds": 0}}}


async def tick(k8s, prom_url: str) -> dict:
    kube = KubeClient(functools.partial(credentials.login, k8s.kubeconfig))
    prometheus = PrometheusClient(prom_url, timeout_s=2.0)
    try:
        ctx = Context(OperatorSettings(namespaces=(NS,)), kube, monitoring=False)
        await autoscale_pool_once(ctx, prometheus, NS, POOL, log, now_s=NOW)
    finally:
        await kube.close()
        await prometheus.aclose()
    return k8s.get(types.API_VERSION, pool_types.PLURAL, POOL, NS)


async def test_four_active_members_with_memory_for_two_a_replica_get_two_replicas(world) -> None:
    k8s, prom, replica = world
    created = k8s.create(pool(1))
    k8s.patch(types.API_VERSION, pool_types.PLURAL, POOL, NS, {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
              "status": {"members": [{"name": m, "model": m, "source": "tiny"} for m in MEMBERS]}}, subresource="status")
    for model in MEMBERS:  # one request running for each: a queue far under target, but four active members
        replica.gauges[REQUESTS_RUNNING].labels(model=model).set(1)
    prom.wait_for(f'sum({REQUESTS_RUNNING}{{pool="{POOL}"}})', lambda v: v == len(MEMBERS), timeout_s=10)
    obj = await tick(k8s, prom.url)
    assert obj["spec"]["replicas"] == 2, obj["status"]["autoscaler"]
    assert obj["status"]["autoscaler"]["lastReason"] == "MemoryFloor"
    active = next(c for c in obj["status"]["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("True", "ValidMetricFound")
    assert "need 2 replicas of memory" in obj["status"]["autoscaler"]["lastDecision"]


@pytest.mark.parametrize(("held", "woken_ago_s", "replicas", "reason"), [
    (0, None, 0, "ScaleToZero"),  # idle far longer than scaleToZeroAfterSeconds
    (0, 10.0, 1, "WaitingForIdleWindow"),  # a gateway woke it 10 s ago: its held requests may not be scraped yet
    (2, None, 1, "Stable"),  # a member's requests are held: demand, never zero
])
async def test_held_requests_and_a_fresh_wake_keep_an_idle_pool_up(world, held: int, woken_ago_s: float | None,
                                                                   replicas: int, reason: str) -> None:
    k8s, prom, replica = world
    for model in MEMBERS:
        replica.gauges[REQUESTS_RUNNING].labels(model=model).set(0)
    replica.held.labels(model="idle", model_namespace=NS).set(held)
    prom.wait_for(f'sum({REQUESTS_RUNNING}{{pool="{POOL}"}}) + sum({GATEWAY_REQUESTS_HELD})', lambda v: v == held,
                  timeout_s=10)
    if k8s.get(types.API_VERSION, pool_types.PLURAL, POOL, NS) is not None:
        k8s.delete(types.API_VERSION, pool_types.PLURAL, POOL, NS)
    body = pool(1)
    if woken_ago_s is not None:
        body["metadata"]["annotations"] = {"flotilla.dev/woken-at": rfc3339.format_time(NOW - woken_ago_s)}
    created = k8s.create(body)
    k8s.patch(types.API_VERSION, pool_types.PLURAL, POOL, NS, {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "status": {"members": [{"name": "idle", "model": "idle", "source": "tiny"}],  # no activity in the window
                   "autoscaler": {"idleSince": rfc3339.format_time(NOW - 10_000),
                                  "recommendations": [{"time": rfc3339.format_time(NOW - 10_000), "replicas": 0}]}}},
              subresource="status")
    obj = await tick(k8s, prom.url)
    assert (obj["spec"]["replicas"], obj["status"]["autoscaler"]["lastReason"]) == (replicas, reason), \
        obj["status"]["autoscaler"]["lastDecision"]



async def test_the_pool_query_reads_the_batch_class_of_every_member(world) -> None:
    """The batch share of waiting and running, summed over the pool's members; the weighing itself is
    decide()'s (test_pool_autoscaler.py, test_autoscaler.py)."""
    _, prom, replica = world
    values = {(CLASS_REQUESTS_WAITING, "m1"): 300, (CLASS_REQUESTS_RUNNING, "m1"): 2, (CLASS_REQUESTS_WAITING, "m2"): 5}
    for (name, model), value in values.items():
        replica.by_class[name].labels(model=model, **{"class": "batch"}).set(value)
    replica.by_class[CLASS_REQUESTS_WAITING].labels(model="m3", **{"class": "interactive"}).set(7)  # not batch
    try:
        prom.wait_for(f'sum({CLASS_REQUESTS_WAITING}{{pool="{POOL}"}})', lambda v: v == 312, timeout_s=10)
        client = PrometheusClient(prom.url, timeout_s=2.0)
        try:
            demand = await measure_pool(client, NS, POOL, list(MEMBERS), 300)
        finally:
            await client.aclose()
    finally:
        for gauge in replica.by_class.values():
            gauge.clear()
    assert (demand.sample.waiting_batch, demand.sample.running_batch) == (305, 2)
