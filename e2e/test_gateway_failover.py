"""Failover through a real flotilla-gateway in front of real `flotilla-server --model tiny` replicas, under a
steady stream of streamed requests (docs/gateway.md, "Failover"):

(a) a replica SIGKILLed mid-run: requests that had no byte yet are answered by another; those cut mid-stream
    end with an SSE error event naming the cause; nothing hangs, and nothing ends any other way;
(b) a rolling restart, each replica SIGTERMed in turn (it drains, then exits) and replaced, the endpoints
    dropping it shortly after the signal as the EndpointSlice controller would: 0 failed requests;
(c) one of two gateways SIGTERMed, with a test balancer that stops sending to a gateway once its readiness has
    failed for a while, as kube-proxy does: its open streams finish, new requests go to the other, 0 failed
    (a 503 counts as failed).

Each scenario runs FLOTILLA_FAILOVER_E2E_S seconds (8 in `make test`; `make bench` runs 60 s, about 200
requests each). The counts of each are printed: completed, retried (the gateway's own counter), error-ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.http.server_process import ServerProcess, run_server
from tests.support.gateway_cluster import GatewayProcess, gateway_process, inference_model, serve_api
from tests.support.k8s_emulator import EmulatorHandle

MODEL = "tiny"
RUN_S = float(os.environ.get("FLOTILLA_FAILOVER_E2E_S", "8"))
CLIENTS = 3
MAX_TOKENS = 200  # about half a second of streaming: a kill lands mid-stream
SETTLE_S = 60.0  # the deadline of a wait: only a hang reaches it
REQUEST_TIMEOUT_S = 60.0  # a request longer than this hangs
ENDPOINTS_LAG_S = 0.5  # the EndpointSlice controller drops a terminating pod after this
BALANCER_LAG_S = 1.0  # the test balancer drops a gateway whose readiness has failed this long


@dataclass
class Ending:
    status: int
    done: bool  # ended with data: [DONE]
    error_event: str | None  # the SSE error event's code, when it ended with one
    failure: str = ""  # anything else: an HTTP error, a cut with no event, a hang


@dataclass
class Stream:
    """CLIENTS workers sending streamed completions, one after another, to whatever `url()` answers."""

    url: object  # () -> str
    endings: list[Ending] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Stream:
        self._threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(CLIENTS)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 5)
            if thread.is_alive():
                self.endings.append(Ending(0, False, None, "a worker hung"))

    def _worker(self) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            while not self._stop.is_set():
                self.endings.append(self._one(client))

    def _one(self, client: httpx.Client) -> Ending:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "stream": True,
                "ignore_eos": True}
        status, done, error = 0, False, None
        try:
            with client.stream("POST", self.url() + "/v1/completions", json=body) as r:  # type: ignore[operator]
                status = r.status_code
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith('data: {"error"'):
                        error = line.split('"code": "', 1)[1].split('"', 1)[0] if '"code": "' in line else "?"
        except httpx.HTTPError as e:
            return Ending(status, done, error, f"{type(e).__name__}: {e}")
        if status != 200:
            return Ending(status, done, error, f"HTTP {status}")
        if not done and error is None:
            return Ending(status, done, error, "cut without an error event")
        return Ending(status, done, error)

    def count(self) -> dict[str, int]:
        return {"completed": sum(e.done for e in self.endings),
                "error-ended": sum(e.error_event is not None for e in self.endings),
                "failed": sum(bool(e.failure) for e in self.endings)}


def slice_for(name: str, server: ServerProcess) -> dict:
    """One EndpointSlice naming `server` (one slice per replica: each listens on its own loopback port)."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": MODEL}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": int(server.base_url.rsplit(":", 1)[1]), "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}


class Fleet:
    """Replicas published one EndpointSlice each; `replace(i)` swaps replica i for a new one."""

    def __init__(self, k8s: EmulatorHandle, directory: Path, stack: contextlib.ExitStack) -> None:
        self.k8s, self.directory, self.stack = k8s, directory, stack
        self.servers: dict[int, ServerProcess] = {}
        self.managers: dict[int, contextlib.AbstractContextManager] = {}

    def start(self, i: int) -> ServerProcess:
        manager = run_server("--max-num-seqs", "4", "--drain-timeout-s", "20", tmp_path=self.directory)
        server = manager.__enter__()
        self.managers[i], self.servers[i] = manager, server
        self.publish(i)
        return server

    def publish(self, i: int, present: bool = True) -> None:
        name = f"{MODEL}-{i}"
        with contextlib.suppress(Exception):
            self.k8s.delete("discovery.k8s.io/v1", "endpointslices", name, "default")
        if present:
            self.k8s.create(slice_for(name, self.servers[i]))

    def stop_all(self) -> None:
        for manager in self.managers.values():
            with contextlib.suppress(Exception):
                manager.__exit__(None, None, None)


def retries(gateway: GatewayProcess) -> float:
    text = httpx.get(gateway.url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "flotilla_gateway_upstream_retries_total")


def ready_replicas(gateway: GatewayProcess) -> list[int]:
    return [m["ready_replicas"] for m in httpx.get(gateway.url + "/v1/models").json()["data"]]


def wait(check, what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, GatewayProcess, GatewayProcess]]:
    directory: Path = tmp_path_factory.mktemp("failover")
    with contextlib.ExitStack() as stack:
        k8s = stack.enter_context(serve_api(directory))
        k8s.create(inference_model(MODEL, replicas=3, routing={"policy": "least-load"}))
        fleet = Fleet(k8s, directory, stack)
        stack.callback(fleet.stop_all)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(fleet.start, range(3)))
        gateways = []
        for name in ("a", "b"):
            (directory / name).mkdir()
            gateways.append(stack.enter_context(gateway_process(k8s.kubeconfig, directory / name,
                                                                "--drain-delay-s", "2")))
        for gateway in gateways:
            wait(lambda gateway=gateway: ready_replicas(gateway) == [3], "the gateways route to three replicas")
        yield fleet, gateways[0], gateways[1]


@pytest.mark.timeout(300)
def test_a_replica_killed_mid_run(world) -> None:
    fleet, gateway, _ = world
    before = retries(gateway)
    with Stream(lambda: gateway.url) as stream:
        time.sleep(RUN_S / 2)
        fleet.servers[0].proc.send_signal(signal.SIGKILL)  # no drain: streams on it are cut
        killed_at = time.monotonic()
        time.sleep(RUN_S / 2)
    fleet.servers[0].proc.wait(10)
    counts = stream.count()
    print(f"\n(a) SIGKILL: {len(stream.endings)} requests: {counts}, retried {retries(gateway) - before:g}; "
          f"{time.monotonic() - killed_at:.1f} s after the kill")
    assert counts["failed"] == 0, [e for e in stream.endings if e.failure][:5]
    assert {e.error_event for e in stream.endings if e.error_event} <= {"upstream_dropped"}
    fleet.start(0)  # back to three, for the next scenario
    wait(lambda: ready_replicas(gateway) == [3], "three replicas again")


@pytest.mark.timeout(300)
def test_a_rolling_restart_fails_nothing(world) -> None:
    fleet, gateway, _ = world
    before = retries(gateway)
    with Stream(lambda: gateway.url) as stream:
        for i in range(3):
            old = fleet.servers[i]
            old.proc.send_signal(signal.SIGTERM)  # it drains: in-flight requests finish, new ones get 503
            time.sleep(ENDPOINTS_LAG_S)
            fleet.publish(i, present=False)
            fleet.start(i)  # the replacement
            old.proc.wait(30)
        time.sleep(1.0)
    counts = stream.count()
    print(f"\n(b) rolling restart: {len(stream.endings)} requests: {counts}, retried {retries(gateway) - before:g}")
    assert counts["failed"] == 0 and counts["error-ended"] == 0, [e for e in stream.endings if e.failure][:5]
    assert counts["completed"] == len(stream.endings) > 0


@pytest.mark.timeout(300)
def test_a_gateway_stopped_behind_a_balancer_fails_nothing(world) -> None:
    _, gateway, other = world
    dropped: set[str] = set()
    failing_since: dict[str, float] = {}
    turn = [0]

    def balance() -> str:
        """kube-proxy, roughly: round-robin over gateways whose readiness has not failed for BALANCER_LAG_S."""
        live = [g.url for g in (gateway, other) if g.url not in dropped]
        turn[0] += 1
        return live[turn[0] % len(live)]

    def watch_readiness(stop: threading.Event) -> None:
        while not stop.is_set():
            for g in (gateway, other):
                try:
                    ok = httpx.get(g.url + "/readyz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    failing_since.pop(g.url, None)
                elif time.monotonic() - failing_since.setdefault(g.url, time.monotonic()) >= BALANCER_LAG_S:
                    dropped.add(g.url)
            stop.wait(0.2)

    stop = threading.Event()
    watcher = threading.Thread(target=watch_readiness, args=(stop,), daemon=True)
    watcher.start()
    try:
        with Stream(balance) as stream:
            time.sleep(RUN_S / 2)
            gateway.process.send_signal(signal.SIGTERM)
            time.sleep(RUN_S / 2)
        # its streams finished, then it exited: uvicorn re-raises the SIGTERM it handled once shut down
        assert gateway.process.wait(40) in (0, -signal.SIGTERM)
    finally:
        stop.set()
        watcher.join(5)
    counts = stream.count()
    print(f"\n(c) gateway SIGTERM: {len(stream.endings)} requests: {counts}; dropped by the balancer: "
          f"{gateway.url in dropped}")
    assert gateway.url in dropped
    assert counts["failed"] == 0 and counts["error-ended"] == 0, [e for e in stream.endings if e.failure][:5]
