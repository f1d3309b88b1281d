"""What gateway tests run against: the Kubernetes emulator serving InferenceModels (with a scale subresource)
and EndpointSlices, fake model servers on their own loopback addresses, and the real gateway process.

Each fake pod listens on its own address (127.0.0.N) on one shared port, as pods of one Service do, and is
published as an endpoint of an EndpointSlice labelled with the Service's name, as Kubernetes does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import attrs
import httpx
import kmock
from flotilla_gateway.bench.fake_upstream import FakeState, make_app

from tests.support.k8s_emulator import ApiError, EmulatorHandle, FlotillaEmulator, Kind, serve
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT_SLICES = Kind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
# The InferenceModel without its schema: these tests read and write only fields the gateway uses.
INFERENCE_MODELS = Kind("flotilla.dev", "v1alpha1", "inferencemodels", "InferenceModel",
                        subresources=("status", "scale"), short_names=("im",))
MODEL_POOLS = Kind("flotilla.dev", "v1alpha1", "modelpools", "ModelPool", subresources=("status", "scale"),
                   short_names=("mp",))


@attrs.define(kw_only=True)
class GatewayEmulator(FlotillaEmulator):
    """The emulator, plus: a JSON patch whose `test` fails on the scale subresource is 422, as the real API
    server answers, instead of a server error."""

    def _scale(self, kind: Kind, ns: str | None, name: str, method: kmock.method, body: Any,
               content_type: str) -> dict[str, Any]:
        try:
            return super()._scale(kind, ns, name, method, body, content_type)
        except (ValueError, KeyError) as error:
            raise ApiError(422, "Invalid", f"the JSON patch was not applied: {error}") from error


@contextlib.contextmanager
def serve_api(directory: Path) -> Iterator[EmulatorHandle]:
    """The emulator serving InferenceModels, ModelPools and EndpointSlices, with a kubeconfig at
    directory/kubeconfig."""
    emulator = GatewayEmulator()
    for kind in (ENDPOINT_SLICES, INFERENCE_MODELS, MODEL_POOLS):
        emulator.register(kind)
    with serve(directory, namespaces=("default", "team-a", "team-b"), emulator=emulator) as handle:
        yield handle


def inference_model(name: str, *, namespace: str = "default", served: str | None = None, replicas: int = 1,
                    **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceModel",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": served or name}, "replicas": replicas, **spec}}


def model_pool(name: str, *, namespace: str = "default", replicas: int = 1, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelPool", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, **spec}}


def join_pool(k8s: EmulatorHandle, model: str, pool: str, namespace: str = "default") -> None:
    """What the operator writes once `model` joined `pool`: its status.pool."""
    k8s.patch("flotilla.dev/v1alpha1", "inferencemodels", model, namespace, {"status": {"pool": pool}},
              subresource="status")


def publish(k8s: EmulatorHandle, service: str, addresses: list[str], port: int, namespace: str = "default",
            ready: bool = True) -> None:
    """Make `addresses` the endpoints of `service` (one EndpointSlice), created or replaced."""
    body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-abcde", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": ready}} for a in addresses]}
    existing = k8s.get("discovery.k8s.io/v1", "endpointslices", body["metadata"]["name"], namespace)
    if existing is None:
        k8s.create(body)
    else:
        replaced = copy.deepcopy(body)
        replaced["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        k8s.request("PUT", f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{service}-abcde",
                    json=replaced)


@dataclass
class FakePods:
    """Fake model servers, one per loopback address, sharing one port, on one background event loop."""

    port: int
    states: dict[str, FakeState] = field(default_factory=dict)  # address → its state
    _loop: asyncio.AbstractEventLoop | None = None
    _runners: list[aiohttp.web.AppRunner] = field(default_factory=list)

    def call(self, fn: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(10)

    def start(self, address: str) -> FakeState:
        state = FakeState(name=address)

        async def up() -> None:
            runner = aiohttp.web.AppRunner(make_app(state), access_log=None)
            await runner.setup()
            await aiohttp.web.TCPSite(runner, address, self.port).start()
            self._runners.append(runner)

        self.call(up)
        self.states[address] = state
        return state


@contextlib.contextmanager
def fake_pods() -> Iterator[FakePods]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-pods", daemon=True)
    thread.start()
    pods = FakePods(port=free_port(), _loop=loop)
    try:
        yield pods
    finally:
        async def down() -> None:
            for runner in pods._runners:
                await runner.cleanup()

        with contextlib.suppress(Exception):
            pods.call(down)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


def start_gateway(kubeconfig: str, log_path: Path, *args: str, wait_ready: bool = True) -> GatewayProcess:
    port = free_port()
    command = [sys.executable, "-m", "flotilla_gateway.cli", "--kubeconfig", kubeconfig, "--host", "127.0.0.1",
               "--port", str(port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    gateway = GatewayProcess(process, port, log_path)
    deadline = time.monotonic() + 60  # a loaded shared CPU can take that long to import and list
    probe = "/readyz" if wait_ready else "/healthz"
    while True:
        try:
            if httpx.get(gateway.url + probe, timeout=1).status_code == 200:
                return gateway
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            gateway.stop()
            raise RuntimeError(f"flotilla-gateway did not answer {probe}:\n{gateway.log()[-4000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def gateway_process(kubeconfig: str, directory: Path, *args: str, wait_ready: bool = True) -> Iterator[GatewayProcess]:
    gateway = start_gateway(kubeconfig, directory / "gateway.log", *args, wait_ready=wait_ready)
    try:
        yield gateway
    finally:
        gateway.stop()
