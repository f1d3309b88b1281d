"""The real gateway routing to fake pods: the route map, streaming, errors, retries, least-load, disconnects, and
a pooled model by residency (the fake pool pods' load reports carry per-model state, as a multi-model
flotilla-server's do): where it is loaded first, a second copy when its queue per copy stays above the pool's
target, a cold load where it fits, else on the pod whose LRU model is oldest."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from flotilla_gateway.routing import PodView, choose, prefix_key_name, routing_key

from tests.gateway.conftest import Fleet
from tests.support.gateway_cluster import inference_model, join_pool, model_pool, publish


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


def test_degraded_model_without_pods_is_503_at_once_and_with_pods_is_served(fleet: Fleet) -> None:
    fleet.model("broken", 0, replicas=1)  # its pods cannot start: nothing will come to serve a held request
    fleet.model("rolled-back", 1)  # a tier move rolled back: the pods it had still serve
    for name, reason, message in (("broken", "ClaimNotFound", "the PVC models does not exist"),
                                  ("rolled-back", "PromotionFailed", "the model stays in the pool tier")):
        fleet.k8s.patch("flotilla.dev/v1alpha1", "inferencemodels", name, "default",
                        {"status": {"conditions": [{"type": "Degraded", "status": "True", "reason": reason,
                                                    "message": message}]}}, subresource="status")
    def refused() -> httpx.Response | None:
        try:  # until the gateway has seen the condition, the request is held: give up on it after a second
            answer = httpx.post(fleet.gateway.url + "/v1/chat/completions", json=chat("broken"), timeout=1)
        except httpx.TimeoutException:
            return None
        return answer if answer.status_code == 503 else None

    r = wait(refused)
    assert "the PVC models does not exist" in r.json()["error"]["message"]
    wait(lambda: fleet.routed("rolled-back", 1), message="rolled-back routed")
    served = httpx.post(fleet.gateway.url + "/v1/chat/completions", json=chat("rolled-back"))
    assert served.status_code == 200, served.text


def test_one_name_in_two_namespaces_routes_to_the_older(fleet: Fleet) -> None:
    old, new = fleet.new_address(), fleet.new_address()
    for address in (old, new):
        fleet.pods.start(address)

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


def test_connect_errors_are_retried_and_the_dead_pod_is_ejected_after_five(fleet: Fleet) -> None:
    dead, live = sorted((fleet.new_address(), fleet.new_address()))  # published; nothing listens on `dead`
    fleet.pods.start(live).load_enabled = False  # no figures from either: neither is filtered out

    fleet.k8s.create(inference_model("flaky", replicas=2))
    publish(fleet.k8s, "flaky", [dead, live], fleet.pods.port)
    wait(lambda: fleet.routed("flaky", 2))
    for _ in range(6):  # equal loads: least-load tries the lower address, `dead`, first
        r = httpx.post(fleet.gateway.url + "/v1/completions", json={"model": "flaky", "prompt": "p", "max_tokens": 1})
        assert r.status_code == 200 and r.json()["served_by"] == live
    metrics = httpx.get(fleet.gateway.url + "/metrics").text
    # five connect errors in a row eject `dead` (one of two pods: half may be out), so the sixth goes to `live`
    assert ('flotilla_gateway_upstream_retries_total{model="flaky",model_namespace="default",reason="connect_error"} 5.0'
            in metrics)
    assert 'flotilla_gateway_pods_ejected{model="flaky",model_namespace="default"} 1.0' in metrics
    ejections = [line for line in metrics.splitlines() if line.startswith('flotilla_gateway_pod_ejections_total{model="flaky"')]
    assert len(ejections) == 1 and f'pod="{dead}:' in ejections[0] and ejections[0].endswith(" 1.0"), ejections


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


def test_prefix_routing_follows_the_pod_whose_cache_holds_the_prompt(fleet: Fleet) -> None:
    pods = fleet.model("prefixed", 3)
    wait(lambda: fleet.routed("prefixed", 3))
    body = {"model": "prefixed", "messages": [{"role": "system", "content": "A tenant's long system prompt."},
                                              {"role": "user", "content": "hi"}], "max_tokens": 2}
    name = prefix_key_name(routing_key("prefixed", "chat", body))
    home = choose([PodView(a, load_age_s=0.1) for a in pods], routing_key("prefixed", "chat", body), "prefix")
    holder = next(a for a in pods if a != home.address)
    fleet.pods.states[holder].load = {**fleet.pods.states[holder].load, "prefix_keys": [name]}
    time.sleep(0.6)  # two polls
    served = [httpx.post(fleet.gateway.url + "/v1/chat/completions", json=body, timeout=30).json()["served_by"]
              for _ in range(4)]
    assert served == [holder] * 4  # where the prompt is cached, not the key's home on the ring
    headers = {k.lower(): v for k, v in fleet.pods.states[holder].last_headers.items()}
    assert headers["x-flotilla-prefix-key"] == name
    spoofed = httpx.post(fleet.gateway.url + "/v1/chat/completions", json=body, timeout=30,
                         headers={"X-Flotilla-Prefix-Key": "0" * 16})  # a client cannot pick another's key
    assert spoofed.json()["served_by"] == holder
    assert {k.lower(): v for k, v in fleet.pods.states[holder].last_headers.items()}["x-flotilla-prefix-key"] == name


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
    # the pod's load series appear at the first poll round after its route does, which the request may
    # beat (CI met none yet): wait for it, bounded
    wait(lambda: 'flotilla_gateway_pod_load{figure="in_flight",model="counted"'
         in httpx.get(fleet.gateway.url + "/metrics").text, 10, "the pod's load series for the new route")


GiB = 2**30
POOL = "residency"


def report(models: dict[str, tuple[str, int, float | None]], free_bytes: int) -> dict[str, Any]:
    """A pool pod's load report: model → (state, waiting, idle seconds)."""
    return {"waiting": sum(w for _, w, _ in models.values()), "slots": 8, "queue_capacity": 64, "kv_usage": 0.0,
            "memory_budget_bytes": 4 * GiB, "memory_free_bytes": free_bytes,
            "models": [{"name": n, "state": s, "waiting": w, "running": 0, "last_used_s": idle, "memory_bytes": GiB}
                       for n, (s, w, idle) in models.items()]}


def residency_choices(fleet: Fleet, model: str) -> dict[str, float]:
    found = {}
    for line in httpx.get(fleet.gateway.url + "/metrics").text.splitlines():
        if line.startswith(f'flotilla_gateway_residency_choices_total{{model="{model}"'):
            found[line.split('tier="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return found


def send(fleet: Fleet, model: str, n: int) -> None:
    for i in range(n):
        r = httpx.post(fleet.gateway.url + "/v1/completions", json={"model": model, "prompt": f"p{i}", "max_tokens": 2})
        assert r.status_code == 200, r.text


def test_residency_routing_through_the_gateway(fleet: Fleet) -> None:
    fleet.k8s.create(model_pool(POOL, replicas=3, scaling={"targetQueueDepth": 4}))
    for member in ("hot", "cold"):
        fleet.k8s.create(inference_model(member, pool=POOL, placement={"policy": "cost-first"}))
        join_pool(fleet.k8s, member, POOL)
    holder, spare, busy = (fleet.new_address() for _ in range(3))
    states = {a: fleet.pods.start(a) for a in (holder, spare, busy)}
    states[holder].load = report({"hot": ("loaded", 0, 0.5), "cold": ("available", 0, None)}, free_bytes=GiB // 2)
    states[spare].load = report({"hot": ("available", 0, None), "cold": ("available", 0, None)}, free_bytes=2 * GiB)
    states[busy].load = report({"hot": ("available", 0, None), "cold": ("available", 0, None),
                                "other": ("loaded", 0, 600.0)}, free_bytes=0)
    publish(fleet.k8s, f"{POOL}-pool", [holder, spare, busy], fleet.pods.port)
    wait(lambda: fleet.routed("hot", 3), message="hot routed to the pool's three pods")
    listed = {m["id"]: m for m in httpx.get(fleet.gateway.url + "/v1/models").json()["data"]}
    assert listed["hot"]["pool"] == POOL and listed["hot"]["replicas"] == 3  # the pool's replicas, not the model's
    time.sleep(0.3)  # a load poll reads the reports

    send(fleet, "hot", 10)  # loaded on one pod: every request goes there, none pays a cold load elsewhere
    assert (states[holder].requests, states[spare].requests, states[busy].requests) == (10, 0, 0)

    send(fleet, "cold", 3)  # loaded nowhere: the pod with free budget loads it, evicting nothing
    assert states[spare].requests == 3
    states[spare].load = report({"hot": ("available", 0, None), "cold": ("loaded", 0, 0.1)}, free_bytes=GiB)
    states[holder].load = report({"hot": ("loaded", 0, 0.5), "cold": ("available", 0, None)}, free_bytes=0)
    time.sleep(0.3)

    # hot's queue per copy (12 > the pool's targetQueueDepth 4) must last SECOND_COPY_AFTER_S before a second copy
    states[holder].load = report({"hot": ("loaded", 12, 0.0), "cold": ("available", 0, None)}, free_bytes=0)
    time.sleep(0.3)
    send(fleet, "hot", 2)
    assert (states[holder].requests, states[spare].requests) == (12, 3)  # pressure, but not for long yet
    time.sleep(2.2)
    send(fleet, "hot", 1)
    assert states[spare].requests == 4  # the second copy goes to the pod with free budget
    send(fleet, "hot", 1)
    assert states[holder].requests == 13  # one copy per window: the next goes back to where it is loaded

    # nowhere free, nowhere loaded: the pod whose least recently used idle model is oldest (busy's, 600 s)
    fleet.k8s.create(inference_model("rare", pool=POOL, placement={"policy": "cost-first"}))
    join_pool(fleet.k8s, "rare", POOL)
    for state in states.values():
        state.load = {**state.load, "memory_free_bytes": 0,
                      "models": [*state.load["models"], {"name": "rare", "state": "available", "memory_bytes": GiB}]}
    wait(lambda: fleet.routed("rare", 3), message="rare routed")
    time.sleep(0.3)
    send(fleet, "rare", 2)
    assert states[busy].requests == 2
    assert residency_choices(fleet, "hot") == {"loaded": 13, "loading": 0, "second_copy": 1, "free": 0, "lru": 0,
                                               "busy": 0, "unlisted": 0}
    assert residency_choices(fleet, "cold")["free"] == 3 and residency_choices(fleet, "rare")["lru"] == 2
