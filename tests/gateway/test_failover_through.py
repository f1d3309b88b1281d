"""Failover through a real gateway process and fake pods: what a client sees when a pod fails.

- a pod that cuts the connection after its headers, before any body byte: the request is answered by another;
- a pod that leaves the endpoints while the gateway waits for its first byte: the same;
- a pod killed mid-stream: the client's stream ends with an SSE error event the `openai` client raises on;
- a pod answering 502 to everything: out of rotation within 5 failures, back after its cool-down;
- a request with `n` choices counts as n in flight on its pod.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import Fleet
from tests.gateway.test_routing_through import wait
from tests.support.gateway_cluster import gateway_process, inference_model, publish


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the gateway's `name` samples carrying `labels`."""
    text = httpx.get(url + "/metrics").text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def test_a_connection_cut_before_the_first_byte_is_answered_by_another_pod(fleet: Fleet) -> None:
    pods = sorted(fleet.new_address() for _ in range(2))
    for address in pods:
        fleet.pods.start(address).load_enabled = False  # equal figures: least-load tries the lower address first
    fleet.k8s.create(inference_model("cut-early", replicas=2))
    publish(fleet.k8s, "cut-early", pods, fleet.pods.port)
    wait(lambda: fleet.routed("cut-early", 2))
    fleet.pods.states[pods[0]].drop_before_body = 1  # its headers go out, then its connection is cut
    answer = httpx.post(fleet.gateway.url + "/v1/completions", timeout=20,
                        json={"model": "cut-early", "prompt": "p", "max_tokens": 3, "stream": True})
    assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
    assert fleet.pods.states[pods[0]].drop_before_body == 0 and fleet.pods.states[pods[1]].completed == 1
    assert metric(fleet.gateway.url, "flotilla_gateway_upstream_retries_total", model="cut-early",
                  reason="dropped_before_body") == 1


def test_a_pod_gone_from_the_endpoints_before_its_first_byte_is_left_for_another(fleet: Fleet) -> None:
    slow, fast = fleet.model("gone", 2)
    wait(lambda: fleet.routed("gone", 2))
    fleet.pods.states[slow].first_byte_delay_s = 30.0
    fleet.pods.states[fast].load["waiting"] = 50  # least-load picks `slow` first
    wait(lambda: httpx.get(fleet.gateway.url + "/metrics").text.count(f'pod="{fast}:') > 0)
    time.sleep(0.6)  # the gateway reads the figures
    sent = time.monotonic()
    with httpx.Client(timeout=20) as client:
        pending = client.build_request("POST", fleet.gateway.url + "/v1/completions",
                                       json={"model": "gone", "prompt": "p", "max_tokens": 1})
        result: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: result.append(client.send(pending)))
        thread.start()
        wait(lambda: fleet.pods.states[slow].running == 1, message="the request reached the slow pod")
        publish(fleet.k8s, "gone", [fast], fleet.pods.port)  # the slow pod leaves the endpoints
        thread.join(20)
    assert result and result[0].status_code == 200 and result[0].json()["served_by"] == fast
    assert time.monotonic() - sent < 10  # not the slow pod's 30 s
    assert metric(fleet.gateway.url, "flotilla_gateway_upstream_retries_total", model="gone", reason="pod_gone") == 1


def test_a_stream_cut_mid_answer_ends_with_an_error_event(fleet: Fleet) -> None:
    (pod,) = fleet.model("cut-late", 1)
    wait(lambda: fleet.routed("cut-late", 1))
    fleet.pods.states[pod].cut_after_chunks = 2
    client = openai.OpenAI(base_url=fleet.gateway.url + "/v1", api_key="unused", max_retries=0)
    received = []
    with pytest.raises(openai.APIError, match="failed mid-answer"):
        for chunk in client.chat.completions.create(model="cut-late", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=8, stream=True):
            received.append(chunk.choices[0].delta.content)
    assert received == ["t0 ", "t1 "]  # what came before the cut, then the error: never a silent short answer
    wait(lambda: metric(fleet.gateway.url, "flotilla_gateway_stream_errors_total", model="cut-late") == 1,
         message="the cut stream counted")


def test_a_pod_answering_502_is_ejected_within_five_failures_and_back_after_its_cool_down(fleet: Fleet) -> None:
    pods = [fleet.new_address() for _ in range(3)]
    for address in pods:
        fleet.pods.start(address).load_enabled = False  # equal figures: least-load tries the lowest first
    fleet.k8s.create(inference_model("outlier", replicas=3))
    publish(fleet.k8s, "outlier", pods, fleet.pods.port)
    bad = sorted(pods)[0]
    fleet.pods.states[bad].statuses = [502] * 1000
    (fleet.directory / "ejecting").mkdir(exist_ok=True)
    with gateway_process(fleet.k8s.kubeconfig, fleet.directory / "ejecting", "--eject-base-s", "2") as gateway:
        wait(lambda: any(m["id"] == "outlier" and m["ready_replicas"] == 3
                         for m in httpx.get(gateway.url + "/v1/models").json()["data"]))
        ask = {"model": "outlier", "prompt": "p", "max_tokens": 1}
        for _ in range(10):
            assert httpx.post(gateway.url + "/v1/completions", json=ask).status_code == 200  # retried elsewhere
        failures = fleet.pods.states[bad].requests
        assert failures <= 5  # out of rotation within 5 failures
        assert metric(gateway.url, "flotilla_gateway_pods_ejected", model="outlier") == 1
        time.sleep(2.2)  # its cool-down
        for _ in range(3):
            assert httpx.post(gateway.url + "/v1/completions", json=ask).status_code == 200
        assert fleet.pods.states[bad].requests > failures  # back in rotation
        assert metric(gateway.url, "flotilla_gateway_pod_ejections_total", model="outlier") == 1


def test_n_choices_count_as_n_in_flight(fleet: Fleet) -> None:
    (pod,) = fleet.model("many", 1)
    wait(lambda: fleet.routed("many", 1))
    fleet.pods.states[pod].first_byte_delay_s = 3.0
    thread = threading.Thread(target=lambda: httpx.post(fleet.gateway.url + "/v1/completions", timeout=20, json={
        "model": "many", "prompt": "p", "max_tokens": 1, "n": 3}))
    thread.start()
    wait(lambda: metric(fleet.gateway.url, "flotilla_gateway_pod_load", model="many", figure="in_flight") == 3,
         message="three in flight")
    thread.join(20)
