"""Rate limits through a real gateway: a key sending twice its limit gets the answers that the burst (one
minute's limit) and the refill (limit/60 per second) predict, and 429s with Retry-After and OpenAI's
x-ratelimit-* headers for the rest; another key is unaffected; the token limit is checked the same way; a
request that can never fit says so, without a Retry-After.

The gateway runs in this process (uvicorn on a thread) so that its rate limits can read a clock the test
holds: each test sends two simulated minutes of traffic, at twice the limit, in a second or two.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from flotilla_gateway.app import Gateway, GatewaySettings
from flotilla_gateway.keys_file import KeysFile
from flotilla_gateway.rate_limit_gate import RateLimits

from tests.support.gateway_cluster import fake_pods, inference_model, publish, serve_api
from tests.support.ports import free_port

KEYS = """\
sk-steady: {tenant: steady, models: [tiny], requestsPerMinute: 60}
sk-wordy: {tenant: wordy, models: [tiny], tokensPerMinute: 600}
sk-other: {tenant: other, models: [tiny], requestsPerMinute: 60, tokensPerMinute: 6000}
"""
SIMULATED_S = 120.0  # two minutes: the burst alone would cover one minute at twice the limit
STEP_S = 0.5  # one request every half second: 120 a minute, twice the 60 requests or 60 × 10 tokens a minute
DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Running:
    url: str
    clock: Clock
    client: httpx.Client

    def send(self, key: str, max_tokens: int = 1, stream: bool = False) -> httpx.Response:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                "stream": stream}
        return self.client.post(self.url + "/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {key}"})

    def metric(self, tenant: str, reason: str) -> float:
        text = self.client.get(self.url + "/metrics").text
        line = f'flotilla_gateway_rate_limited_requests_total{{reason="{reason}",tenant="{tenant}"}} '
        return next((float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)), 0.0)


@contextlib.contextmanager
def in_process_gateway(kubeconfig: str, keys: Path, clock: Clock) -> Iterator[str]:
    gateway = Gateway(GatewaySettings(kubeconfig=kubeconfig, keys=KeysFile(keys), poll_interval_s=0.1))
    gateway.rate_limits = RateLimits(gateway.metrics.rate_limited, clock=clock)  # the clock this test holds
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(gateway.app(), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not (server.started and httpx.get(url + "/readyz").status_code == 200):
            assert thread.is_alive() and time.monotonic() < deadline, "the gateway never turned ready"
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    directory = tmp_path_factory.mktemp("rate-limits")
    (directory / "keys.yaml").write_text(KEYS)
    clock = Clock()
    with serve_api(directory) as k8s, fake_pods() as pods, \
            in_process_gateway(str(directory / "kubeconfig"), directory / "keys.yaml", clock) as url, \
            httpx.Client(timeout=10) as client:
        pods.start("127.0.0.2")
        k8s.create(inference_model("tiny"))
        publish(k8s, "tiny", ["127.0.0.2"], pods.port)
        deadline = time.monotonic() + 15
        while not any(m["id"] == "tiny" and m["ready_replicas"] == 1
                      for m in client.get(url + "/v1/models").json()["data"]):
            assert time.monotonic() < deadline, "tiny was never routed"
            time.sleep(0.05)
        yield Running(url, clock, client)


def assert_refusal(response: httpx.Response, kind: str, limit: int) -> None:
    assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers[f"x-ratelimit-limit-{kind}"] == str(limit)
    assert int(response.headers[f"x-ratelimit-remaining-{kind}"]) >= 0
    assert DURATION.match(response.headers[f"x-ratelimit-reset-{kind}"])


def test_a_key_at_twice_its_request_limit_gets_burst_plus_refill(running: Running) -> None:
    start_s, answered, refused = running.clock.now_s, 0, 0
    steps = int(SIMULATED_S / STEP_S)
    for step in range(steps):
        running.clock.now_s = start_s + step * STEP_S
        response = running.send("sk-steady")
        if response.status_code == 200:
            answered += 1
            assert response.headers["x-ratelimit-limit-requests"] == "60"  # answers carry the headers too
        else:
            refused += 1
            assert_refusal(response, "requests", 60)
        if step % 20 == 0:  # another key, well within its own limit, meanwhile: never refused
            assert running.send("sk-other").status_code == 200
    predicted = 60 + 60 * SIMULATED_S / 60  # the burst, plus the refill at 1 request a second
    assert abs(answered - predicted) <= 0.05 * predicted, (answered, predicted)
    assert running.metric("steady", "requests") == refused == steps - answered
    assert running.metric("other", "requests") == 0


def test_a_key_at_twice_its_token_limit_gets_burst_plus_refill(running: Running) -> None:
    """Each request reserves 10 tokens: "hi" (1 token at 4 characters a token) plus max_tokens 9; the fake
    pod streams 9 events, so each answer uses the 10 it reserved and reconciling changes nothing."""
    start_s, answered = running.clock.now_s + 600, 0
    for step in range(int(SIMULATED_S / STEP_S)):
        running.clock.now_s = start_s + step * STEP_S
        response = running.send("sk-wordy", max_tokens=9, stream=True)
        if response.status_code == 200:
            answered += 1
            assert response.text.count("data: ") == 10  # 9 events and [DONE]
        else:
            assert_refusal(response, "tokens", 600)
            assert "This request reserves 10 tokens" in response.json()["error"]["message"]
        if step % 20 == 0:
            assert running.send("sk-other", max_tokens=9, stream=True).status_code == 200
    predicted = (600 + 600 * SIMULATED_S / 60) / 10  # the burst, plus the refill at 10 tokens a second
    assert abs(answered - predicted) <= 0.05 * predicted, (answered, predicted)


def test_a_request_that_can_never_fit_says_so_without_retry_after(running: Running) -> None:
    running.clock.now_s += 600  # every bucket full again
    response = running.send("sk-wordy", max_tokens=600)  # 601 tokens: more than the whole minute's 600
    assert response.status_code == 429 and "retry-after" not in response.headers
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and error["param"] == "max_tokens"
    assert "can never fit" in error["message"] and "Lower max_tokens" in error["message"]
    assert response.headers["x-ratelimit-remaining-tokens"] == "600"  # it charged nothing
    assert running.send("sk-wordy", max_tokens=599).status_code == 200
    assert running.metric("wordy", "too_large") == 1
