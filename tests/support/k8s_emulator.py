"""A Kubernetes API server for tests: kmock's KubernetesEmulator with the semantics real clients need.

kmock serves discovery, routing and errors; this subclass keeps the objects itself and adds what
kopf and kubectl-like clients rely on: uid, resourceVersion, creationTimestamp, generation (bumped
on spec changes only), typed lists, label/field selectors, merge and JSON patches, the status and
scale subresources, finalizers, watches that resume from a resourceVersion, garbage collection by
owner references, and (optionally) CRD defaulting and validation including CEL rules.

Use it through `serve()`, which runs it on a free loopback port in a background thread and writes
a kubeconfig; the returned handle is a small synchronous client for the test itself:

    with serve(tmp_path, crds=[load_yaml("crds/flotilla.dev_inferencemodels.yaml")]) as k8s:
        subprocess.Popen(["flotilla-operator", "-n", "default"], env={"KUBECONFIG": k8s.kubeconfig, ...})
        k8s.create(example)
        k8s.eventually(lambda: k8s.get("apps/v1", "deployments", "tiny", "default"))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp.test_utils
import aiohttp.web
import httpx
import yaml

from tests.support.k8s_apiserver import FlotillaEmulator
from tests.support.k8s_kinds import BUILTIN_KINDS, MONITORING_KINDS, ApiError, Kind, kind_from_crd

__all__ = ["ApiError", "EmulatorHandle", "FlotillaEmulator", "Kind", "api_path", "serve", "write_kubeconfig"]


def write_kubeconfig(path: Path, url: str, namespace: str = "default", token_file: Path | None = None) -> Path:
    """A kubeconfig for the emulator; `token_file`: the user's token is read from that file (tokenFile)."""
    user = {"tokenFile": str(token_file)} if token_file else {"token": "emulator-token"}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": user}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}],
    }))
    return path


def api_path(api_version: str, plural: str, name: str | None = None, namespace: str | None = None,
             subresource: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base] + ([f"namespaces/{namespace}"] if namespace else []) + [plural]
    parts += [name] if name else []
    parts += [subresource] if subresource else []
    return "/".join(parts)


@dataclass
class EmulatorHandle:
    """A running emulator: its URL and kubeconfig, plus a synchronous client for tests."""

    url: str
    kubeconfig: str
    emulator: FlotillaEmulator
    http: httpx.Client

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.json().get("reason", ""), response.text)
        return response.json()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        plural = self.plural(obj["apiVersion"], obj["kind"])
        return self.request("POST", api_path(obj["apiVersion"], plural, namespace=meta.get("namespace")), json=obj)

    def get(self, api_version: str, plural: str, name: str, namespace: str | None = None,
            subresource: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        response = self.http.get(api_path(api_version, plural, name, namespace, subresource))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def list(self, api_version: str, plural: str, namespace: str | None = None, labels: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": labels} if labels else {}
        return self.request("GET", api_path(api_version, plural, namespace=namespace), params=params)["items"]

    def patch(self, api_version: str, plural: str, name: str, namespace: str | None, patch: Any,
              subresource: str | None = None, content_type: str = "application/merge-patch+json") -> dict[str, Any]:
        return self.request("PATCH", api_path(api_version, plural, name, namespace, subresource),
                            content=json.dumps(patch), headers={"Content-Type": content_type})

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.request("DELETE", api_path(api_version, plural, name, namespace))

    def plural(self, api_version: str, kind_name: str) -> str:
        group = api_version.rpartition("/")[0]
        for kind in list(self.emulator.kinds.values()):
            if kind.group == group and kind.kind == kind_name:
                return kind.plural
        raise KeyError(f"the emulator serves no {kind_name} in {api_version}")

    def eventually(self, check: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.1,
                   message: str = "condition") -> Any:
        """Poll `check` until it returns a truthy value (returned) or raise AssertionError."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(interval_s)
        raise AssertionError(f"{message} not reached within {timeout_s} s (last value: {last!r})")


@contextlib.contextmanager
def serve(directory: Path, crds: list[dict[str, Any]] = (), monitoring: bool = False,
          namespaces: tuple[str, ...] = ("default",), garbage_collection: bool = True,
          emulator: FlotillaEmulator | None = None) -> Iterator[EmulatorHandle]:
    """Run an emulator on 127.0.0.1:<free port> in a thread; write `directory/kubeconfig` pointing at it.

    `crds` are registered (their schemas default and validate writes); `monitoring` also serves the
    monitoring.coreos.com kinds, as if the Prometheus operator were installed. `emulator`: a subclass
    instance to serve instead (k8s_auth.TokenEmulator); one with a `token_file` gets a kubeconfig that
    reads it, and the handle's own client sends the token in that file at each request.
    """
    if emulator is None:
        emulator = FlotillaEmulator(garbage_collection=garbage_collection)
    for kind in BUILTIN_KINDS + (MONITORING_KINDS if monitoring else ()):
        emulator.register(kind)
    for crd in crds:
        emulator.register(kind_from_crd(crd))
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        async with emulator:
            server = aiohttp.test_utils.RawTestServer(emulator, host="127.0.0.1", port=0)
            await server.start_server()
            holder["url"], holder["stop"] = str(server.make_url("")).rstrip("/"), asyncio.Event()
            started.set()
            await holder["stop"].wait()
            await server.close()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), name="k8s-emulator", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the Kubernetes emulator did not start within 10 s")
    url = holder["url"]
    token_file: Path | None = getattr(emulator, "token_file", None)
    kubeconfig = write_kubeconfig(directory / "kubeconfig", url, token_file=token_file)

    def authorize(request: httpx.Request) -> None:
        if token_file is not None:
            request.headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"

    http = httpx.Client(base_url=url, timeout=10, event_hooks={"request": [authorize]})
    handle = EmulatorHandle(url, str(kubeconfig), emulator, http)
    for ns in namespaces:
        handle.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        yield handle
    finally:
        handle.http.close()
        loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(10)
        loop.close()
