"""The gateway in front of a ModelPool's two pods: a real multi-model `flotilla-server` with the memory budget
for one of two tiny members, and a fake pod (its load report set by the test). Residency routing reads the
real server's report: the first member loads there, the second goes where it fits rather than evicting the
first, and the first keeps going where it is loaded. Every request completes, nothing is evicted, and the real
server loads once; routing by load alone would send the second member to it and evict the first."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from flotilla_gateway.bench.fake_upstream import FakeState
from flotilla_server.engine.config import EngineConfig
from flotilla_server.model_cache.engine_processes import EngineProcesses
from prometheus_client.parser import text_string_to_metric_families

from tests.server.http.server_process import ServerProcess, run_server
from tests.support.gateway_cluster import (
    FakePods,
    GatewayProcess,
    fake_pods,
    gateway_process,
    inference_model,
    join_pool,
    model_pool,
    serve_api,
)

KV_BYTES = 4 * 2**20
MEMBERS = ("t1", "t2")


def publish_pods(k8s, service: str, addresses: list[str]) -> None:
    """One EndpointSlice per pod (each listens on its own port, and a slice's ports apply to all its endpoints)."""
    for i, address in enumerate(addresses):
        host, port = address.split(":")
        k8s.create({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": f"{service}-{i}", "namespace": "default",
                                 "labels": {"kubernetes.io/service-name": service}},
                    "addressType": "IPv4", "ports": [{"name": "http", "port": int(port), "protocol": "TCP"}],
                    "endpoints": [{"addresses": [host], "conditions": {"ready": True}}]})


@dataclass
class Pool:
    server: ServerProcess
    fake: FakeState
    gateway: GatewayProcess
    footprint_bytes: int


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    directory: Path = tmp_path_factory.mktemp("real-pool")
    footprint = EngineProcesses(EngineConfig(kv_cache_memory_bytes=KV_BYTES), "inprocess").footprint_bytes("tiny")
    models = tuple(a for m in MEMBERS for a in ("--model", f"{m}=tiny"))
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(run_server(
            "--memory-budget", str(footprint * 3 // 2), "--kv-cache-memory", str(KV_BYTES), "--min-residency-s", "0",
            "--engine-mode", "inprocess", "--max-num-seqs", "4", tmp_path=directory, model_args=models))
        pods: FakePods = stack.enter_context(fake_pods())
        fake = pods.start("127.0.0.9")
        fake.load = report({"other": ("loaded", 1)}, free_bytes=0)  # full, and nothing idle: a last resort
        k8s = stack.enter_context(serve_api(directory))
        k8s.create(model_pool("real", replicas=2))
        for member in MEMBERS:
            k8s.create(inference_model(member))
            join_pool(k8s, member, "real")
        publish_pods(k8s, "real-pool", [server.base_url.removeprefix("http://"), f"127.0.0.9:{pods.port}"])
        gateway = stack.enter_context(gateway_process(k8s.kubeconfig, directory, "--poll-interval-s", "0.1"))
        deadline = time.monotonic() + 10
        while [m["ready_replicas"] for m in httpx.get(gateway.url + "/v1/models").json()["data"]] != [2, 2] \
                or not reports_read(gateway, pods=2):
            assert time.monotonic() < deadline, httpx.get(gateway.url + "/metrics").text
            time.sleep(0.1)
        yield Pool(server, fake, gateway, footprint)


def reports_read(gateway: GatewayProcess, pods: int) -> bool:
    """The gateway has read every pool pod's load report for every member. Before that a pod lists no model,
    so the first request is placed by load alone (the "unlisted" tier) and may go to either pod."""
    text = httpx.get(gateway.url + "/metrics").text
    ages = [s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "flotilla_gateway_pod_load" and s.labels["figure"] == "age_seconds"]
    return len(ages) == pods * len(MEMBERS) and min(ages) >= 0


def report(models: dict[str, tuple[str, int]], free_bytes: int) -> dict:
    """The fake pod's load report: model → (state, running)."""
    return {"waiting": 0, "slots": 4, "queue_capacity": 32, "kv_usage": 0.0, "memory_free_bytes": free_bytes,
            "models": [{"name": n, "state": s, "running": r, "last_used_s": 0.0} for n, (s, r) in models.items()]}


def summed(server: ServerProcess, sample: str) -> float:
    """A server metric summed over its models."""
    text = httpx.get(server.base_url + "/metrics").text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == sample)


def states(server: ServerProcess) -> dict[str, str]:
    return {m["name"]: m["state"] for m in httpx.get(server.base_url + "/flotilla/v1/load").json()["models"]}


def ask(pool: Pool, model: str, i: int) -> None:
    client = openai.OpenAI(base_url=pool.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"hi {i}"}],
                                            max_tokens=4, stream=True,
                                            extra_body={"ignore_eos": True})  # tiny's sampled text may meet EOS
    assert sum(len(c.choices) for c in stream) >= 4
    time.sleep(0.25)  # a load poll or two: the gateway sees where the model now is


def test_a_member_goes_where_it_fits_not_where_it_would_evict(pool: Pool) -> None:
    for i in range(3):
        ask(pool, "t1", i)  # loaded nowhere: the real server has free budget for it, the fake pod none
    assert pool.fake.requests == 0
    assert states(pool.server) == {"t1": "loaded", "t2": "available"}
    pool.fake.load = report({"other": ("loaded", 1), "t1": ("available", 0), "t2": ("available", 0)},
                            free_bytes=4 * pool.footprint_bytes)
    time.sleep(0.3)
    for i in range(6):
        ask(pool, ("t2", "t1")[i % 2], i)  # t2 fits only on the fake pod; t1 stays where it is loaded
    assert pool.fake.requests == 3
    assert states(pool.server) == {"t1": "loaded", "t2": "available"}
    assert summed(pool.server, "flotilla_model_evictions_total") == 0
    assert summed(pool.server, "flotilla_model_load_seconds_count") == 1  # one cold load, then warm
    metrics = httpx.get(pool.gateway.url + "/metrics").text
    choices = {tier: f'flotilla_gateway_residency_choices_total{{model="{m}",model_namespace="default",tier="{tier}"}}'
               for m, tier in (("t1", "loaded"), ("t2", "free"))}
    assert f"{choices['loaded']} 5.0" in metrics and f"{choices['free']} 3.0" in metrics
