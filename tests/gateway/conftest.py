"""One emulated API server, one set of fake pods and one gateway per test module: tests name their own models."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gateway_cluster import (
    FakePods,
    GatewayProcess,
    fake_pods,
    gateway_process,
    inference_model,
    publish,
    serve_api,
)
from tests.support.k8s_emulator import EmulatorHandle

_addresses = itertools.count(2)


@dataclass
class Fleet:
    k8s: EmulatorHandle
    pods: FakePods
    gateway: GatewayProcess
    directory: Path

    def new_address(self) -> str:
        return f"127.0.0.{next(_addresses)}"

    def model(self, name: str, num_pods: int, **spec: object) -> list[str]:
        """An InferenceModel `name` with `num_pods` fake pods ready; their addresses."""
        self.k8s.create(inference_model(name, replicas=max(num_pods, spec.pop("replicas", num_pods)), **spec))
        addresses = [self.new_address() for _ in range(num_pods)]
        for address in addresses:
            self.pods.start(address)
        if addresses:
            publish(self.k8s, name, addresses, self.pods.port)
        return addresses

    def routed(self, name: str, num_pods: int) -> bool:
        import httpx

        models = httpx.get(self.gateway.url + "/v1/models").json()["data"]
        return any(m["id"] == name and m["ready_replicas"] == num_pods for m in models)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("fleet")
    with serve_api(directory) as k8s, fake_pods() as pods, \
            gateway_process(k8s.kubeconfig, directory, "--poll-interval-s", "0.1") as gateway:
        yield Fleet(k8s, pods, gateway, directory)
