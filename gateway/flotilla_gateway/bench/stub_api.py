"""A fixed fleet for the gateway's benchmarks: just enough of the Kubernetes API for its route map.

The benchmarks run the real gateway process (its watcher, route map, routing and proxy) without a cluster:
this stub lists the InferenceModels and EndpointSlices it was given, one slice per pod (each pod listens
on its own port, and a slice's ports apply to all its endpoints), and holds every watch open with no
events, so the fleet never changes while a benchmark runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

CREATED = "2026-01-01T00:00:00Z"


@dataclass(frozen=True)
class StubModel:
    name: str  # the InferenceModel's name, its Service's and the served model name
    pods: tuple[tuple[str, int], ...]  # (host, port) of each ready pod
    policy: str | None = None  # spec.routing.policy; None: the gateway's default per endpoint


def objects(models: list[StubModel], namespace: str = "default") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(InferenceModels, EndpointSlices) as the API would list them."""
    inference_models, slices = [], []
    for model in models:
        spec: dict[str, Any] = {"model": {"name": model.name}, "replicas": len(model.pods)}
        if model.policy is not None:
            spec["routing"] = {"policy": model.policy}
        inference_models.append({"metadata": {"name": model.name, "namespace": namespace, "creationTimestamp": CREATED,
                                              "resourceVersion": "1", "generation": 1}, "spec": spec})
        for i, (host, port) in enumerate(model.pods):
            slices.append({"metadata": {"name": f"{model.name}-{i}", "namespace": namespace, "resourceVersion": "1",
                                        "labels": {"kubernetes.io/service-name": model.name}},
                           "ports": [{"name": "http", "port": port}],
                           "endpoints": [{"addresses": [host], "conditions": {"ready": True}}]})
    return inference_models, slices


def stub_kubernetes(models: list[StubModel]) -> web.Application:
    inference_models, slices = objects(models)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            response = web.StreamResponse()
            await response.prepare(request)
            await asyncio.sleep(3600)
            return response
        items = inference_models if request.path.endswith("inferencemodels") else slices
        return web.json_response({"metadata": {"resourceVersion": "1"}, "items": items})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return app


async def serve_stub(models: list[StubModel], workdir: Path) -> tuple[web.AppRunner, Path]:
    """Serve the stub on a free loopback port, on the running event loop; returns (runner, kubeconfig path).
    Stop it with `await runner.cleanup()`."""
    runner = web.AppRunner(stub_kubernetes(models))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "stub",
        "clusters": [{"name": "stub", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "stub", "user": {"token": "stub"}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}]}))
    return runner, kubeconfig


def main(argv: list[str] | None = None) -> None:
    """Serve a fixed fleet until interrupted, for a gateway started by hand (docs/benchmarks.md)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m flotilla_gateway.bench.stub_api", description=main.__doc__)
    p.add_argument("--model", required=True, help="The served model name.")
    p.add_argument("--pod", action="append", required=True, metavar="HOST:PORT", help="A ready pod; repeatable.")
    p.add_argument("--policy", choices=("least-load", "prefix"), help="spec.routing.policy; default: unset.")
    p.add_argument("--kubeconfig", type=Path, required=True, help="Where to write the kubeconfig that reaches the stub.")
    args = p.parse_args(argv)
    pods = tuple((host, int(port)) for host, port in (pod.rsplit(":", 1) for pod in args.pod))

    async def serve() -> None:
        args.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        runner, written = await serve_stub([StubModel(args.model, pods, args.policy)], args.kubeconfig.parent)
        written.replace(args.kubeconfig)
        print(f"stub Kubernetes API up; kubeconfig: {args.kubeconfig}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
