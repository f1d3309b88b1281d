"""The real gateway routing to fake pods: the route map, streaming, errors, retries, least-load, disconnects."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.gateway.conftest import Fleet
from tests.support.gateway_cluster import inference_model


def chat(model: str, stream: bool = True, max_tokens: int = 8, **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            "max_tokens": max_tokens, **extra}


def wait(check, timeout_s: float = 10.0, message: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"{message} not reached within {timeout_s} s")


def test_streams_through_and_lists_the_fleet(fleet: Fleet) -> None:
    fleet.model("alpha", 2)
    wait(lambda: fleet.routed("alpha", 2), message="alpha routed")
    with httpx.stream("POST", fleet.gateway.url + "/v1/chat/completions", json=chat("alpha", max_tokens=5)) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) == 6 and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["delta"]["content"] == "t0 "
    plain = httpx.post(fleet.gateway.url + "/v1/completions", json={"model": "alpha", "prompt": "x", "max_tokens": 3})
    assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == "t0 t1 t2 "
    listed = {m["id"]: m for m in httpx.get(fleet.gateway.url + "/v1/models").json()["data"]}
    assert listed["alpha"]["status"] == "ready" and listed["alpha"]["namespace"] == "default"


def test_unknown_model_is_404_in_openai_shape(fleet: Fleet) -> None:
    r = httpx.post(fleet.gateway.url + "/v1/chat/completions", json=chat("nope"))
    assert r.status_code == 404
    error = r.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "not_found_error")


@pytest.mark.parametrize(("content", "status", "fragment"), [
    (b"{not json", 400, "is not valid JSON"),
    (b'{"messages": []}', 400, "model: Field required"),
    (b"[]", 400, "must be a JSON object"),
    (b'{"model": "' + b"x" * (4 * 1024 * 1024) + b'"}', 413, "larger than 4194304 bytes"),
])
def test_bad_bodies_get_the_servers_4xx(fleet: Fleet, content: bytes, status: int, fragment: str) -> None:
    r = httpx.post(fleet.gateway.url + "/v1/chat/completions", content=content,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status and fragment in r.json()["error"]["message"]


def test_degraded_model_is_503_at_once_with_its_message(fleet: Fleet) -> None:
    fleet.model("broken", 1)
    fleet.k8s.patch("flotilla.dev/v1alpha1", "inferencemodels", "broken", "default",
                    {"status": {"conditions": [{"type": "Degraded", "status": "True", "reason": "ClaimNotFound",
                                                "message": "the PVC models does not exist"}]}}, subresource="status")
    r = wait(lambda: (x := httpx.post(fleet.gateway.url + "/v1/chat/completions", json=chat("broken"))).status_code
             == 503 and x)
    assert "the PVC models does not exist" in r.json()["error"]["message"]


def test_one_name_in_two_namespaces_routes_to_the_older(fleet: Fleet) -> None:
    old, new = fleet.new_address(), fleet.new_address()
    for address in (old, new):
        fleet.pods.start(address)
    from tests.support.gateway_cluster import publish

    fleet.k8s.create(inference_model("shared", namespace="team-b"))
    time.sleep(1.1)  # creationTimestamp has one-second resolution
    fleet.k8s.create(inference_model("shared", namespace="team-a"))
    publish(fleet.k8s, "shared", [old], fleet.pods.port, namespace="team-b")
    publish(fleet.k8s, "shared", [new], fleet.pods.port, namespace="team-a")
    wait(lambda: fleet.routed("shared", 1))
    for _ in range(5):
        r = httpx.post(fleet.gateway.url + "/v1/chat/completions", json=chat("shared", stream=False))
        assert r.json()["served_by"] == old


def test_retries_before_the_first_byte_go_to_another_pod(fleet: Fleet) -> None:
    a, b = fleet.model("retry", 2)
    wait(lambda: fleet.routed("retry", 2))
    fleet.pods.states[a].statuses = [503] * 10
    fleet.pods.states[b].statuses = [503] * 10
    r = httpx.post(fleet.gateway.url + "/v1/chat/completions", json=chat("retry", stream=False))
    assert r.status_code == 503  # both pods refused: the last answer passes through, after one retry
    first, other = sorted((a, b))  # equal loads: least-load picks the lower address first
    fleet.pods.states[first].statuses, fleet.pods.states[other].statuses = [502] * 100, []
    before = fleet.pods.states[first].requests
    for _ in range(8):  # completions: least-load
        r = httpx.post(fleet.gateway.url + "/v1/completions", json={"model": "retry", "prompt": "p", "max_tokens": 1})
        assert r.status_code == 200 and r.json()["served_by"] == other
    refused = fleet.pods.states[first].requests - before
    assert refused >= 1  # tried there first (unless its figures went stale under a loaded CPU), then retried
    assert f'flotilla_gateway_upstream_retries_total{{model="retry",model_namespace="default",reason="502"}} {refused}.0' \
        in httpx.get(fleet.gateway.url + "/metrics").text


def test_connect_errors_are_retried(fleet: Fleet) -> None:
    dead, live = sorted((fleet.new_address(), fleet.new_address()))  # published; nothing listens on `dead`
    fleet.pods.start(live).load_enabled = False  # no figures from either: neither is filtered out
    from tests.support.gateway_cluster import publish

    fleet.k8s.create(inference_model("flaky", replicas=2))
    publish(fleet.k8s, "flaky", [dead, live], fleet.pods.port)
    wait(lambda: fleet.routed("flaky", 2))
    for _ in range(6):  # equal loads: least-load tries the lower address, `dead`, first
        r = httpx.post(fleet.gateway.url + "/v1/completions", json={"model": "flaky", "prompt": "p", "max_tokens": 1})
        assert r.status_code == 200 and r.json()["served_by"] == live
    assert ('flotilla_gateway_upstream_retries_total{model="flaky",model_namespace="default",reason="connect_error"} 6.0'
            in httpx.get(fleet.gateway.url + "/metrics").text)


def test_least_load_avoids_the_deep_queue(fleet: Fleet) -> None:
    busy, *others = fleet.model("balanced", 3)
    fleet.pods.states[busy].load = {"waiting": 40, "slots": 64, "queue_capacity": 512, "kv_usage": 0.5}
    wait(lambda: fleet.routed("balanced", 3))
    time.sleep(0.3)  # a poll or two

    async def send() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(client.post(fleet.gateway.url + "/v1/completions",
                                               json={"model": "balanced", "prompt": f"p{i}", "max_tokens": 2})
                                   for i in range(60)))

    asyncio.run(send())
    counts = {a: fleet.pods.states[a].requests for a in (busy, *others)}
    assert counts[busy] < 60 / 6, counts


def test_client_disconnect_closes_the_upstream(fleet: Fleet) -> None:
    (pod,) = fleet.model("slow", 1)
    fleet.pods.states[pod].chunk_interval_s = 0.05
    wait(lambda: fleet.routed("slow", 1))
    with httpx.stream("POST", fleet.gateway.url + "/v1/chat/completions", json=chat("slow", max_tokens=200)) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    wait(lambda: fleet.pods.states[pod].disconnects == 1, 5, "the pod saw the disconnect")
    assert fleet.pods.states[pod].completed == 0


def test_metrics_carry_model_and_namespace(fleet: Fleet) -> None:
    fleet.model("counted", 1)
    wait(lambda: fleet.routed("counted", 1))
    httpx.post(fleet.gateway.url + "/v1/chat/completions", json=chat("counted", stream=False))
    text = httpx.get(fleet.gateway.url + "/metrics").text
    assert 'flotilla_gateway_requests_total{code="200",model="counted",model_namespace="default"' in text
    assert "flotilla_gateway_routing_decision_seconds_bucket" in text
    assert 'flotilla_gateway_pod_load{figure="in_flight",model="counted"' in text
