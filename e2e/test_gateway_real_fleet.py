"""Three real `flotilla-server --model tiny` replicas behind a real flotilla-gateway: least-load steers new
requests away from the replica with a deep queue, and clients that leave mid-stream through the gateway
leave no KV block held on any server (docs/gateway.md, "Routing" and "Passing through").

Each replica is published as its own EndpointSlice (one address each, as the EndpointSlice controller
may split a Service), on the emulated Kubernetes API. Waits poll for what they wait for (the gateway's own view
of each pod's load included, on its /metrics), with deadlines that only a hang reaches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.http.server_process import ServerProcess, run_server
from tests.support.gateway_cluster import GatewayProcess, gateway_process, inference_model, serve_api
from tests.support.k8s_emulator import EmulatorHandle

MODEL = "tiny"
SLOTS = 2
DEEP_QUEUE = 12  # direct requests on replica 0: 2 running, 10 waiting (under its queue capacity of 16)
NEW_REQUESTS = 120
DISCONNECTS = 36  # at once: 2/3 of the fleet's 54 places (3 x (2 slots + 16 queued)), margin for the gateway's spread
SETTLE_S = 60.0  # the deadline of a wait: only a hang reaches it
TEST_TIMEOUT_S = 300  # the first test also starts the fleet: three servers importing torch at once


@dataclass
class Fleet:
    k8s: EmulatorHandle
    servers: list[ServerProcess]
    gateway: GatewayProcess


def slice_for(server: ServerProcess, i: int) -> dict:
    host, port = server.base_url.removeprefix("http://").split(":")
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{MODEL}-{i}", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": MODEL}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": int(port), "protocol": "TCP"}],
            "endpoints": [{"addresses": [host], "conditions": {"ready": True}}]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory: Path = tmp_path_factory.mktemp("fleet")
    with contextlib.ExitStack() as stack:
        k8s = stack.enter_context(serve_api(directory))
        managers = [run_server("--max-num-seqs", str(SLOTS), "--max-model-len", "2048", tmp_path=directory)
                    for _ in range(3)]
        with ThreadPoolExecutor(3) as pool:  # the three start at once
            futures = [pool.submit(m.__enter__) for m in managers]
            servers, failures = [], []
            for manager, future in zip(managers, futures, strict=True):
                try:
                    servers.append(future.result())
                    stack.push(manager.__exit__)
                except RuntimeError as error:
                    failures.append(error)
        if failures:
            raise failures[0]
        k8s.create(inference_model(MODEL, replicas=3, routing={"policy": "least-load"}))
        for i, server in enumerate(servers):
            k8s.create(slice_for(server, i))
        gateway = stack.enter_context(gateway_process(k8s.kubeconfig, directory))
        deadline = time.monotonic() + SETTLE_S
        while [m["ready_replicas"] for m in httpx.get(gateway.url + "/v1/models").json()["data"]] != [3]:
            assert time.monotonic() < deadline, httpx.get(gateway.url + "/v1/models").text
            time.sleep(0.1)
        yield Fleet(k8s, servers, gateway)


def routed(gateway: GatewayProcess, since_chars: int) -> dict[str, int]:
    """Requests answered 200 per pod, from the gateway's access log written after `since_chars`."""
    counts: dict[str, int] = {}
    for line in gateway.log()[since_chars:].splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("logger") == "flotilla_gateway.access" and entry.get("status") == 200:
                counts[entry["pod"]] = counts.get(entry["pod"], 0) + 1
    return counts


def wait_idle(servers: list[ServerProcess], timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    for server in servers:
        while server.metric("flotilla_kv_blocks_used") != 0 or server.metric("flotilla_requests_running") \
                or server.metric("flotilla_requests_waiting"):
            assert time.monotonic() < deadline, f"{server.base_url} still holds KV blocks or requests"
            time.sleep(0.1)


def gateway_sees_waiting(gateway: GatewayProcess, pod: str) -> float:
    """The waiting requests of `pod` (host:port) as the gateway last read them (its flotilla_gateway_pod_load)."""
    text = httpx.get(gateway.url + "/metrics", timeout=5).text
    return max((s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "flotilla_gateway_pod_load" and s.labels.get("pod") == pod
                and s.labels.get("figure") == "waiting"), default=0.0)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_least_load_sends_the_deep_queue_under_a_sixth(fleet: Fleet) -> None:
    deep = fleet.servers[0]

    async def scenario() -> list[int]:
        long_body = {"model": MODEL, "prompt": "a long story", "max_tokens": 1500, "ignore_eos": True,
                     "stream": True}
        async with httpx.AsyncClient(timeout=120) as direct:
            async def hog() -> None:  # direct traffic, around the gateway: the deep queue
                async with direct.stream("POST", deep.base_url + "/v1/completions", json=long_body) as r:
                    async for _ in r.aiter_bytes():
                        pass

            hogs = [asyncio.create_task(hog()) for _ in range(DEEP_QUEUE)]
            deadline = time.monotonic() + SETTLE_S
            deep_pod = deep.base_url.removeprefix("http://")
            # queued on the server, then seen queued by the gateway (it reads each pod's load every 0.25 s)
            while deep.metric("flotilla_requests_waiting") < DEEP_QUEUE - SLOTS \
                    or await asyncio.to_thread(gateway_sees_waiting, fleet.gateway, deep_pod) < DEEP_QUEUE - SLOTS:
                assert time.monotonic() < deadline, "the direct traffic did not queue up, or the gateway did not see it"
                await asyncio.sleep(0.1)
            try:
                async with httpx.AsyncClient(timeout=60) as client:
                    limit = asyncio.Semaphore(8)

                    async def one(i: int) -> int:
                        async with limit:
                            r = await client.post(fleet.gateway.url + "/v1/completions",
                                                  json={"model": MODEL, "prompt": f"q {i}", "max_tokens": 2})
                            return r.status_code

                    statuses = await asyncio.gather(*(one(i) for i in range(NEW_REQUESTS)))
                    still_waiting = deep.metric("flotilla_requests_waiting")
                    assert still_waiting > 0, "the deep queue drained before the new requests ended: lengthen it"
                    return statuses
            finally:
                for task in hogs:
                    task.cancel()
                await asyncio.gather(*hogs, return_exceptions=True)

    since = len(fleet.gateway.log())
    started = time.monotonic()
    statuses = asyncio.run(scenario())
    took_s = time.monotonic() - started
    assert statuses == [200] * NEW_REQUESTS
    counts = routed(fleet.gateway, since)
    got = [counts.get(s.base_url.removeprefix("http://"), 0) for s in fleet.servers]
    print(f"\nleast-load: {NEW_REQUESTS} requests in {took_s:.1f} s; per replica {got} (replica 0 had the deep queue)")
    assert sum(got) == NEW_REQUESTS
    assert got[0] < NEW_REQUESTS / 6, got  # round-robin would send it 1/3
    wait_idle(fleet.servers)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_disconnects_through_the_gateway_leave_no_kv_blocks(fleet: Fleet) -> None:
    async def leave(client: httpx.AsyncClient, i: int) -> None:
        async with client.stream("POST", fleet.gateway.url + "/v1/completions",
                                 json={"model": MODEL, "prompt": f"story {i}", "max_tokens": 500,
                                       "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200, (r.status_code, (await r.aread())[:300])
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return  # leave after the first token

    async def all_leave() -> None:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=DISCONNECTS)) as client:
            await asyncio.gather(*(leave(client, i) for i in range(DISCONNECTS)))

    gone_before = sum(s.metric("flotilla_requests_total", code="499") for s in fleet.servers)
    started = time.monotonic()
    asyncio.run(all_leave())
    wait_idle(fleet.servers)
    gone = sum(s.metric("flotilla_requests_total", code="499") for s in fleet.servers) - gone_before
    print(f"\ndisconnects: {DISCONNECTS} clients left; every server back to 0 KV blocks "
          f"{time.monotonic() - started:.1f} s after the first request; 499s {gone:.0f}")
    assert gone == DISCONNECTS  # each one cancelled on its server, none ran to the end
    assert all(s.metric("flotilla_kv_blocks_used") == 0 for s in fleet.servers)
