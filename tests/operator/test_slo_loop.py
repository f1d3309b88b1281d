"""The SLO side of the autoscale loop against the API emulator and a real Prometheus scraping fake replicas.

One fake replica exports the queue gauges and the latency histograms (with the contract's buckets), so the
PromQL of slo_prometheus.py runs for real: histogram_quantile over the window, the requests in it, and the
bucket increases that status.slo's attainment is read from. A second exports only the gauges, as a server
too old to have the histograms. `autoscale_once` runs with a controlled decision clock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import pytest
import yaml
from flotilla_contract.metrics import (
    INTER_TOKEN_LATENCY_SECONDS,
    ITL_BUCKETS_S,
    LATENCY_BUCKETS_S,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from flotilla_operator import types
from flotilla_operator.prometheus import RUNNING, SLOTS, WAITING
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from tests.operator.test_autoscaler_loop import NS, ROOT, condition
from tests.operator.test_autoscaler_loop import deployment as loop_deployment
from tests.operator.test_autoscaler_loop import tick as loop_tick
from tests.support.k8s_emulator import serve
from tests.support.ports import free_port
from tests.support.prometheus import RealPrometheus, Target

NAME, MODEL, OLD_MODEL = "slo", "slo-model", "old-model"
WINDOW_S = 5
SLO = {"ttftSeconds": 0.5, "windowSeconds": WINDOW_S}


class Replica:
    """A fake server of `model`: the queue gauges, and the latency histograms unless `histograms` is False."""

    def __init__(self, model: str, histograms: bool) -> None:
        registry = CollectorRegistry()
        self.gauges = {n: Gauge(n, n, ["model"], registry=registry).labels(model=model) for n in (WAITING, RUNNING, SLOTS)}
        self.gauges[SLOTS].set(2)
        if histograms:
            self.ttft = Histogram(TIME_TO_FIRST_TOKEN_SECONDS, "ttft", ["model"], buckets=LATENCY_BUCKETS_S,
                                  registry=registry).labels(model=model)
            self.itl = Histogram(INTER_TOKEN_LATENCY_SECONDS, "itl", ["model"], buckets=ITL_BUCKETS_S,
                                 registry=registry).labels(model=model)
        self.port = free_port()
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple]:
    crd = yaml.safe_load((ROOT / "crds" / "flotilla.dev_inferencemodels.yaml").read_text())
    replica, old = Replica(MODEL, histograms=True), Replica(OLD_MODEL, histograms=False)
    try:
        with serve(tmp_path_factory.mktemp("k8s"), crds=[crd]) as k8s, RealPrometheus() as prom:
            prom.set_targets([Target(f"127.0.0.1:{r.port}", {"namespace": NS, "model": m, "pod": f"{m}-0"})
                              for r, m in ((replica, MODEL), (old, OLD_MODEL))])
            prom.wait_for("count(flotilla_slots)", lambda v: v == 2)
            yield k8s, prom, replica
    finally:
        replica.close()
        old.close()


def model(served: str, replicas: int, slo: dict | None) -> dict:
    """Cost-first with targetQueueDepth 16: the queue-depth rule alone keeps one replica for what these tests
    queue, so whatever scales out is the SLO."""
    return {"apiVersion": types.API_VERSION, "kind": types.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"model": {"name": served, "source": {"builtin": "tiny"}}, "replicas": replicas,
                     "placement": {"policy": "cost-first"},
                     "scaling": {"minReplicas": 1, "maxReplicas": 6, "targetQueueDepth": 16,
                                 "scaleDownStabilizationSeconds": 30},
                     "server": {"maxNumSeqs": 2, "maxBatchedTokens": 64, "prefillChunk": 64},
                     **({"slo": slo} if slo else {})}}


deployment = functools.partial(loop_deployment, name=NAME)
tick = functools.partial(loop_tick, name=NAME)


@pytest.fixture
def fresh(world):
    k8s, prom, replica = world
    for kind, plural in ((types.API_VERSION, types.PLURAL), ("apps/v1", "deployments")):
        for existing in k8s.list(kind, plural, NS):
            k8s.delete(kind, plural, existing["metadata"]["name"], NS)
    return k8s, prom, replica


async def test_a_missed_ttft_scales_up_and_status_shows_the_figures(fresh) -> None:
    k8s, prom, replica = fresh
    k8s.create(model(MODEL, 1, SLO))
    deployment(k8s, ready=1)
    replica.gauges[RUNNING].set(2)
    replica.gauges[WAITING].set(2)  # queue depth: D = 4 against T = 18, one replica is plenty
    for _ in range(20):
        replica.ttft.observe(2.0)  # all in the (1, 2.5] bucket: p90 = 1 + 0.9 x 1.5 = 2.35 s
    prom.wait_for(f'sum(increase({TIME_TO_FIRST_TOKEN_SECONDS}_count{{model="{MODEL}"}}[{WINDOW_S}s]))',
                  lambda v: v > 0, timeout_s=10)
    obj = await tick(k8s, prom.url, time.time())
    auto = obj["status"]["autoscaler"]
    # s = 4.7, capped at 2: ceil(1 x 2 / 0.9) = 3; the queue-depth rule said 1 and lost
    assert (obj["spec"]["replicas"], auto["lastReason"]) == (3, "SloScaleUp"), auto["lastDecision"]
    assert "queue depth: " in auto["lastDecision"] and "ttft p90=2.35s/0.5s" in auto["lastDecision"]
    figures = obj["status"]["slo"]
    assert figures["ttftSeconds"] == pytest.approx(2.35, abs=1e-3) and figures["ttftAttainment"] == 0.0
    assert figures["requests"] >= 20 and figures["windowSeconds"] == WINDOW_S and figures["signal"] > 4
    assert [r["replicas"] for r in auto["slo"]["recommendations"]] == [1, 3] and auto["slo"]["readyReplicas"] == 1
    assert condition(obj)["status"] == "True"
    events = [e for e in k8s.list("v1", "events", NS) if e["involvedObject"]["uid"] == obj["metadata"]["uid"]]
    assert [e["reason"] for e in events] == ["SloScaleUp"] and "1 -> 3" in events[0]["message"]

    # spec.slo removed: its figures and memory go, and the queue-depth rule decides alone
    k8s.patch(types.API_VERSION, types.PLURAL, NAME, NS, {"spec": {"slo": None}})
    obj = await tick(k8s, prom.url, time.time() + 1)
    assert "slo" not in obj["status"] and "slo" not in obj["status"]["autoscaler"]
    replica.gauges[WAITING].set(0)


async def test_no_latency_series_holds_and_says_why(fresh) -> None:
    k8s, prom, _ = fresh
    k8s.create(model(OLD_MODEL, 2, SLO))  # its server exports no latency histogram
    deployment(k8s, ready=2)
    t0 = time.time()
    obj = await tick(k8s, prom.url, t0)
    obj = await tick(k8s, prom.url, t0 + 3600)  # the queue-depth rule alone would be down to 1 by now
    assert obj["spec"]["replicas"] == 2 and obj["status"]["autoscaler"].get("lastScaleTime") is None  # nothing moved
    # the schema cannot know Prometheus' scrape interval: the hold says what to change
    assert (condition(obj)["status"], condition(obj)["reason"]) == ("False", "SloNotMeasured")
    assert "slo.windowSeconds" in condition(obj)["message"]
    warnings = [e for e in k8s.list("v1", "events", NS) if e.get("type") == "Warning" and e["reason"] == "SloNotMeasured"]
    assert len(warnings) == 1  # once, when the condition turned
    assert "ttftSeconds" not in obj["status"]["slo"]  # nothing measured: nothing shown (a merge patch's null)


def test_the_simulator_reads_a_histogram_as_this_prometheus_does(world) -> None:
    """flotilla-sim's histogram_quantile, fed the same observations, gives what Prometheus gives."""
    import numpy as np
    from flotilla_sim.latency import ITL_BOUNDS, bucket_of, histogram_quantile

    _, prom, replica = world
    values = [0.0007, 0.003, 0.003, 0.015, 0.03, 0.03, 0.05, 0.1, 0.2, 0.5, 1.0, 3.0]  # 3.0: past the top bucket
    for value in values:
        replica.itl.observe(value)
    selector = f'{{model="{MODEL}"}}'
    prom.wait_for(f"sum(increase({INTER_TOKEN_LATENCY_SECONDS}_count{selector}[60s]))", lambda v: v > 0, timeout_s=10)
    counts = np.bincount(bucket_of(np.array(values), ITL_BOUNDS), minlength=len(ITL_BOUNDS) + 1).astype(float)
    for q in (0.1, 0.5, 0.9, 0.99):
        expr = f"histogram_quantile({q}, sum by (le) (increase({INTER_TOKEN_LATENCY_SECONDS}_bucket{selector}[60s])))"
        real = prom.query(expr)[0][1]
        assert histogram_quantile(q, counts, ITL_BOUNDS)[0] == pytest.approx(real, rel=1e-6), q
