"""Scale from zero through flotilla-gateway, the whole loop: a cost-first model at zero replicas gets 20
concurrent requests; the gateway holds them, wakes the model (0 → 1), the operator and the pod runner bring a
real server up, and every request completes. None is refused, and the model never goes back to zero while
any is held.

The first request must reach the pod within 1 s of the pod turning ready. Both ends are recorded as they
happen, by the system rather than by this test's client (whose event loop shares a busy machine): the pod
runner's time of the first /readyz 200 (it plays the kubelet), and the gateway's access log, which gives
each request's arrival (the log line's time less its duration), time held, and time to the pod's first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import httpx

from e2e.conftest import SETTLE_S
from e2e.harness import Loop, epoch, inference_model
from tests.support.gateway_cluster import gateway_process

NAME = "gw-zero"
REQUESTS = 20


async def stream_all(url: str) -> list[tuple[int, float | None, bool]]:
    """(status, time.time() of the first token as the client read it, ended with [DONE]) for each request."""
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, float | None, bool]:
        first: float | None = None
        done = False
        async with client.stream("POST", url + "/v1/completions",
                                 json={"model": NAME, "prompt": f"hello {i}", "max_tokens": 8, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and first is None:
                    first = time.time()
                done = done or line == "data: [DONE]"
            return r.status_code, first, done

    async with httpx.AsyncClient(timeout=180) as client:
        return await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))


def first_bytes(gateway_log: str) -> list[float]:
    """When each request of NAME answered 200 got its pod's first byte (epoch seconds), from the access log:
    arrival + held + first byte, the arrival being the line's time less the request's duration."""
    out = []
    for line in gateway_log.splitlines():
        entry = json.loads(line) if line.startswith("{") else {}
        if entry.get("logger") == "flotilla_gateway.access" and entry.get("model") == NAME and entry.get("status") == 200:
            arrived = epoch(entry["ts"]) - entry["duration_s"]
            out.append(arrived + entry["held_s"] + entry["first_byte_s"])
    return out


def test_held_requests_wake_a_model_at_zero_and_all_complete(loop: Loop, tmp_path) -> None:
    loop.apply(inference_model(NAME, "cost-first", replicas=0, minReplicas=0, maxReplicas=2,
                               scaleToZeroAfterSeconds=30, scaleDownStabilizationSeconds=4))
    seen: list[int] = []
    stop = threading.Event()

    def watch_replicas() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a transient API error is not a replica count
                seen.append(loop.replicas(NAME))
            stop.wait(0.2)

    try:
        with gateway_process(loop.k8s.kubeconfig, tmp_path, "--namespace", "default") as gateway:
            loop.wait(lambda: NAME in httpx.get(gateway.url + "/v1/models").text, SETTLE_S, "the gateway lists the model")
            assert loop.replicas(NAME) == 0
            watcher = threading.Thread(target=watch_replicas, daemon=True)
            watcher.start()
            started = time.time()
            results = asyncio.run(stream_all(gateway.url))
            stop.set()
            watcher.join(5)
            # a request's access line is written once its response ended, which may be after the client read its
            # last byte: wait for the lines (a hang guard; on a loaded machine once one was still missing)
            deadline = time.monotonic() + 10
            while len(first_bytes(gateway.log())) < REQUESTS and time.monotonic() < deadline:
                time.sleep(0.1)
            gateway_log = gateway.log()
        assert [status for status, _, _ in results] == [200] * REQUESTS  # all held, none refused
        assert all(done for _, _, done in results)
        woken = seen.index(1) if 1 in seen else None
        assert woken is not None and 0 not in seen[woken:], seen  # never back to zero while held
        assert loop.events(NAME, "ScaleToZero") == []  # the operator's own record of every scale to zero
        annotations = loop.model(NAME)["metadata"].get("annotations") or {}
        assert "flotilla.dev/woken-at" in annotations
        ready_at = min(loop.runner.ready_epochs[NAME])
        answered = first_bytes(gateway_log)
        assert len(answered) == REQUESTS, gateway_log[-2000:]
        first_token = min(t for _, t, _ in results if t is not None)
        dispatch_after_ready_s = min(answered) - ready_at
        print(f"\nscale from zero: first request to first token {first_token - started:.2f} s; the pod's first byte "
              f"{dispatch_after_ready_s:.2f} s after it turned ready (the client read the first token "
              f"{first_token - ready_at:.2f} s after)")
        assert dispatch_after_ready_s < 1.0
    finally:
        stop.set()
        loop.delete(NAME)
        loop.wait(lambda: loop.runner.processes(NAME) == 0, SETTLE_S, "servers stopped")
