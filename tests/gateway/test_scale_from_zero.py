"""The activator through the real gateway: held requests, the conditional wake, bounds, restarts and drain."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from tests.gateway.conftest import Fleet
from tests.support.gateway_cluster import gateway_process, inference_model, join_pool, model_pool, publish

IM = ("flotilla.dev/v1alpha1", "inferencemodels")
MP = ("flotilla.dev/v1alpha1", "modelpools")


def wait(check, timeout_s: float = 10.0, message: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"{message} not reached within {timeout_s} s")


def body(model: str, i: int = 0) -> dict:
    return {"model": model, "prompt": f"p{i}", "max_tokens": 2}


def replicas(fleet: Fleet, name: str) -> int:
    return fleet.k8s.get(*IM, name, "default")["spec"]["replicas"]


def woken_at(fleet: Fleet, kind: tuple, name: str) -> str:
    """The woken-at stamp on an InferenceModel or ModelPool, "" before a gateway writes it."""
    annotations = fleet.k8s.get(*kind, name, "default")["metadata"].get("annotations") or {}
    return annotations.get("flotilla.dev/woken-at", "")


def held(url: str, model: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(f'flotilla_gateway_requests_held{{model="{model}"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def post_all(url: str, model: str, n: int, timeout_s: float = 30) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return await asyncio.gather(*(client.post(url + "/v1/completions", json=body(model, i)) for i in range(n)))


def test_held_requests_wake_the_model_and_complete(fleet: Fleet) -> None:
    fleet.k8s.create(inference_model("sleepy", replicas=0))
    wait(lambda: "sleepy" in httpx.get(fleet.gateway.url + "/v1/models").text)
    address = fleet.new_address()

    async def scenario() -> list[httpx.Response]:
        sending = asyncio.ensure_future(post_all(fleet.gateway.url, "sleepy", 20))
        await asyncio.to_thread(wait, lambda: held(fleet.gateway.url, "sleepy") == 20, 10, "20 held")
        await asyncio.sleep(0.3)  # a load poll or two refresh the ages
        metrics = httpx.get(fleet.gateway.url + "/metrics").text
        assert 'flotilla_gateway_hold_max_wait_seconds{model="sleepy",model_namespace="default"} 300.0' in metrics
        oldest = next(line for line in metrics.splitlines()
                      if line.startswith('flotilla_gateway_oldest_held_seconds{model="sleepy"'))
        assert float(oldest.rsplit(" ", 1)[1]) > 0.2
        assert replicas(fleet, "sleepy") == 1  # woken at once, before any pod exists
        await asyncio.to_thread(wait, lambda: woken_at(fleet, IM, "sleepy").endswith("Z"), 10, "stamped")
        state = fleet.pods.start(address)
        state.load = {"waiting": 0, "slots": 2, "queue_capacity": 3, "kv_usage": 0.0}
        state.first_byte_delay_s = 0.2
        publish(fleet.k8s, "sleepy", [address], fleet.pods.port)
        return await sending

    responses = asyncio.run(scenario())
    assert [r.status_code for r in responses] == [200] * 20  # none refused
    assert fleet.pods.states[address].max_running <= 8  # released no faster than the pod's queue takes
    assert held(fleet.gateway.url, "sleepy") == 0


def test_a_full_hold_queue_is_429_and_a_spent_wait_503(fleet: Fleet) -> None:
    fleet.k8s.create(inference_model("bounded", replicas=0, coldStart={"maxHeld": 5, "maxWaitSeconds": 2}))
    wait(lambda: "bounded" in httpx.get(fleet.gateway.url + "/v1/models").text)
    started = time.monotonic()
    responses = asyncio.run(post_all(fleet.gateway.url, "bounded", 10))
    by_status: dict[int, list[httpx.Response]] = {}
    for r in responses:
        by_status.setdefault(r.status_code, []).append(r)
    assert sorted((s, len(rs)) for s, rs in by_status.items()) == [(429, 5), (503, 5)]
    assert all(r.headers["retry-after"] == "2" for r in responses)
    assert by_status[429][0].json()["error"]["code"] == "hold_queue_full"
    assert by_status[503][0].json()["error"]["type"] == "service_unavailable"
    assert 1.8 < time.monotonic() - started < 5


def test_scaling_disabled_at_zero_is_503_at_once_and_wakes_nothing(fleet: Fleet) -> None:
    fleet.k8s.create(inference_model("pinned", replicas=0, scaling={"disabled": True}))
    wait(lambda: "pinned" in httpx.get(fleet.gateway.url + "/v1/models").text)
    r = httpx.post(fleet.gateway.url + "/v1/completions", json=body("pinned"))
    assert r.status_code == 503 and "autoscaling is off" in r.json()["error"]["message"]
    time.sleep(0.3)
    assert replicas(fleet, "pinned") == 0


def test_a_wake_racing_an_autoscaler_write_keeps_the_larger_count(fleet: Fleet) -> None:
    fleet.k8s.create(inference_model("racy", replicas=0, coldStart={"maxWaitSeconds": 2}))
    wait(lambda: "racy" in httpx.get(fleet.gateway.url + "/v1/models").text)
    fleet.k8s.emulator.delays_s["PATCH inferencemodels"] = 1.0  # the gateway's write arrives late

    async def scenario() -> None:
        sending = asyncio.ensure_future(post_all(fleet.gateway.url, "racy", 1))
        await asyncio.to_thread(wait, lambda: held(fleet.gateway.url, "racy") == 1, 10, "held, its wake sent")
        await asyncio.to_thread(fleet.k8s.request, "PUT", "/apis/flotilla.dev/v1alpha1/namespaces/default/"
                                "inferencemodels/racy/scale", json={"spec": {"replicas": 3}})
        await sending

    try:
        asyncio.run(scenario())
    finally:
        fleet.k8s.emulator.delays_s.clear()
    assert replicas(fleet, "racy") == 3
    assert 'flotilla_gateway_wakes_total{model="racy",model_namespace="default",result="lost_race"} 1.0' in \
        httpx.get(fleet.gateway.url + "/metrics").text


def test_two_gateways_waking_at_once_write_one(fleet: Fleet, tmp_path) -> None:
    fleet.k8s.create(inference_model("twice", replicas=0, coldStart={"maxWaitSeconds": 1}))
    with gateway_process(fleet.k8s.kubeconfig, tmp_path) as second:
        for url in (fleet.gateway.url, second.url):
            wait(lambda url=url: "twice" in httpx.get(url + "/v1/models").text)

        async def both() -> None:
            await asyncio.gather(post_all(fleet.gateway.url, "twice", 3), post_all(second.url, "twice", 3))

        asyncio.run(both())
        results = [line for url in (fleet.gateway.url, second.url) for line in httpx.get(url + "/metrics").text.splitlines()
                   if line.startswith('flotilla_gateway_wakes_total{model="twice"')]
    assert replicas(fleet, "twice") == 1
    assert sum(float(r.rsplit(" ", 1)[1]) for r in results if 'result="woken"' in r) == 1


def test_a_client_leaving_does_not_cancel_the_wake(fleet: Fleet) -> None:
    fleet.k8s.create(inference_model("left", replicas=0))
    wait(lambda: "left" in httpx.get(fleet.gateway.url + "/v1/models").text)
    fleet.k8s.emulator.delays_s["PATCH inferencemodels"] = 0.5
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(fleet.gateway.url + "/v1/completions", json=body("left"), timeout=0.2)
        wait(lambda: replicas(fleet, "left") == 1, 5, "woken after the client left")
    finally:
        fleet.k8s.emulator.delays_s.clear()
    wait(lambda: held(fleet.gateway.url, "left") == 0, 5, "the gone client's hold released")


def test_a_restarted_gateway_holds_not_404s(fleet: Fleet, tmp_path) -> None:
    fleet.k8s.create(inference_model("restart", replicas=0, coldStart={"maxWaitSeconds": 1}))
    with gateway_process(fleet.k8s.kubeconfig, tmp_path, wait_ready=False) as fresh:
        r = httpx.post(fresh.url + "/v1/completions", json=body("restart"), timeout=10)  # maybe before the listing
    assert r.status_code == 503 and r.json()["error"]["code"] == "hold_timeout"  # held, never 404


def test_sigterm_refuses_held_requests_and_finishes_streams(fleet: Fleet, tmp_path) -> None:
    fleet.k8s.create(inference_model("draining", replicas=0))
    (pod,) = fleet.model("streaming", 1)
    fleet.pods.states[pod].chunk_interval_s = 0.02
    with gateway_process(fleet.k8s.kubeconfig, tmp_path) as gateway:
        wait(lambda: '"ready_replicas":1' in httpx.get(gateway.url + "/v1/models").text.replace(" ", ""))

        async def scenario() -> tuple[httpx.Response, list[str]]:
            async with httpx.AsyncClient(timeout=30) as client:
                holding = asyncio.ensure_future(client.post(gateway.url + "/v1/completions", json=body("draining")))
                lines: list[str] = []
                async with client.stream("POST", gateway.url + "/v1/completions",
                                         json={"model": "streaming", "prompt": "x", "max_tokens": 60,
                                               "stream": True}) as stream:
                    async for line in stream.aiter_lines():
                        if not lines:
                            gateway.process.send_signal(signal.SIGTERM)
                        lines.append(line)
                return await holding, lines

        refused, lines = asyncio.run(scenario())
        assert gateway.process.wait(15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "data: [DONE]" in lines and len([x for x in lines if x.startswith("data: ")]) == 61


def test_members_of_a_pool_at_zero_are_held_and_wake_the_pool_once(fleet: Fleet) -> None:
    fleet.k8s.create(model_pool("napping", replicas=0))
    for member in ("nap-a", "nap-b"):
        fleet.k8s.create(inference_model(member, replicas=1))
        join_pool(fleet.k8s, member, "napping")
    fleet.k8s.create(inference_model("nap-late", replicas=1))  # joins only after its requests are held
    wait(lambda: '"pool":"napping"' in httpx.get(fleet.gateway.url + "/v1/models").text.replace(" ", ""))
    address = fleet.new_address()
    fleet.pods.start(address)

    def pool_replicas() -> int:
        return fleet.k8s.get(*MP, "napping", "default")["spec"]["replicas"]

    def woken(*models: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(fleet.gateway.url + "/metrics").text.splitlines()
                   if line.startswith("flotilla_gateway_wakes_total") and 'result="woken"' in line
                   and any(f'model="{m}"' in line for m in models))

    async def two_members() -> list[httpx.Response]:
        sending = asyncio.gather(post_all(fleet.gateway.url, "nap-a", 3), post_all(fleet.gateway.url, "nap-b", 3))
        await asyncio.to_thread(wait, lambda: pool_replicas() == 1, 10, "the pool woken")
        # the stamp is a second write after the scale write: wait for it rather than race it
        await asyncio.to_thread(wait, lambda: woken_at(fleet, MP, "napping").endswith("Z"), 10, "the pool stamped")
        assert [replicas(fleet, m) for m in ("nap-a", "nap-b")] == [1, 1]  # the members' own scale is untouched
        publish(fleet.k8s, "napping-pool", [address], fleet.pods.port)  # the pool's Service is NAME-pool
        return [r for batch in await sending for r in batch]

    assert [r.status_code for r in asyncio.run(two_members())] == [200] * 6
    assert woken("nap-a", "nap-b") == 1  # one wake of the pool, not one per member

    fleet.k8s.patch(*MP, "napping", "default", {"spec": {"replicas": 0}}, subresource="scale")
    publish(fleet.k8s, "napping-pool", [], fleet.pods.port)

    async def late_member() -> list[httpx.Response]:
        sending = post_all(fleet.gateway.url, "nap-late", 3)
        task = asyncio.ensure_future(sending)
        await asyncio.to_thread(wait, lambda: held(fleet.gateway.url, "nap-late") == 3, 10, "held")
        await asyncio.sleep(0.3)
        assert pool_replicas() == 0  # not a member yet: nothing of the pool's to wake
        join_pool(fleet.k8s, "nap-late", "napping")  # its held requests now wait on the pool: wake it
        await asyncio.to_thread(wait, lambda: pool_replicas() == 1, 10, "the pool woken for the late member")
        publish(fleet.k8s, "napping-pool", [address], fleet.pods.port)
        return await task

    assert [r.status_code for r in asyncio.run(late_member())] == [200] * 3
    assert woken("nap-late") == 1 and fleet.pods.states[address].requests == 9


def test_the_charts_cluster_role_allows_every_request_of_the_gateway(fleet: Fleet) -> None:
    from tests.chart.render import by_kind, render
    from tests.support.rbac import allows

    fleet.k8s.create(inference_model("audited", replicas=0, coldStart={"maxWaitSeconds": 1}))
    fleet.k8s.create(model_pool("audited", replicas=0))  # and a pooled model, whose wake is its pool's
    fleet.k8s.create(inference_model("audited-member", coldStart={"maxWaitSeconds": 1}))
    join_pool(fleet.k8s, "audited-member", "audited")
    wait(lambda: '"pool":"audited"' in httpx.get(fleet.gateway.url + "/v1/models").text.replace(" ", ""))

    async def both() -> None:
        await asyncio.gather(post_all(fleet.gateway.url, "audited", 1), post_all(fleet.gateway.url, "audited-member", 1))

    asyncio.run(both())
    for kind, name in ((IM, "audited"), (MP, "audited")):
        wait(lambda kind=kind, name=name: woken_at(fleet, kind, name) != "")
    (role,) = [r for r in by_kind(render("default"), "ClusterRole") if r["metadata"]["name"].endswith("-gateway")]
    requests = {(e.verb, e.group, e.resource) for e in fleet.k8s.emulator.audit if e.user_agent == "flotilla-gateway"}
    assert {("patch", "flotilla.dev", "inferencemodels/scale"), ("patch", "flotilla.dev", "inferencemodels"),
            ("patch", "flotilla.dev", "modelpools/scale"), ("patch", "flotilla.dev", "modelpools"),
            ("watch", "flotilla.dev", "modelpools"), ("watch", "discovery.k8s.io", "endpointslices")} <= requests
    refused = [r for r in requests if not allows(role["rules"], *r)]
    assert refused == []
    granted = {(verb, group, resource) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == requests  # and nothing more: least privilege
