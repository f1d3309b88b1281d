"""The gateway in front of a real `flotilla-server --model tiny`, with API keys on at both: the openai SDK
streams through it (the gateway sends the servers' own key), bad keys never reach the server, tenants cannot
pose as each other, and disconnects free the KV."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.http.server_process import ServerProcess, run_server
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

KEYS = """
sk-team-a: {tenant: team-a, models: [tiny, probe]}
sk-team-b: {tenant: team-b, models: [probe], class: batch}
"""
SERVER_KEY = "sk-servers-only"


@dataclass
class Setup:
    k8s: EmulatorHandle
    server: ServerProcess
    pods: FakePods
    gateway: GatewayProcess
    probe: str  # the fake pod's address


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    directory: Path = tmp_path_factory.mktemp("real")
    (directory / "keys.yaml").write_text(KEYS)
    (directory / "server-key").write_text(SERVER_KEY + "\n")
    with serve_api(directory) as k8s, run_server("--max-num-seqs", "4", env={"FLOTILLA_API_KEY": SERVER_KEY},
                                                 tmp_path=directory) as server, \
            fake_pods() as pods:
        k8s.create(inference_model("tiny"))
        host, port = server.base_url.removeprefix("http://").split(":")
        publish(k8s, "tiny", [host], int(port))
        probe = "127.0.0.200"
        pods.start(probe)
        k8s.create(inference_model("probe"))
        publish(k8s, "probe", [probe], pods.port)
        with gateway_process(k8s.kubeconfig, directory, "--api-keys-file", str(directory / "keys.yaml"),
                             "--upstream-api-key-file", str(directory / "server-key")) as gateway:
            deadline = time.monotonic() + 10
            while [m["ready_replicas"] for m in httpx.get(gateway.url + "/v1/models").json()["data"]] != [1, 1]:
                assert time.monotonic() < deadline, httpx.get(gateway.url + "/v1/models").text
                time.sleep(0.1)
            yield Setup(k8s, server, pods, gateway, probe)


def test_the_openai_sdk_streams_through_the_gateway(setup: Setup) -> None:
    client = openai.OpenAI(base_url=setup.gateway.url + "/v1", api_key="sk-team-a")
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                            max_tokens=8, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})  # tiny's sampled text may meet EOS
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert sum(len(c.choices) for c in chunks) >= 8
    direct = openai.OpenAI(base_url=setup.server.base_url + "/v1", api_key="sk-team-a", max_retries=0)
    with pytest.raises(openai.AuthenticationError):  # a tenant's key opens the gateway, not the servers
        direct.models.list()


def test_a_json_schema_request_passes_through_the_gateway_unchanged(setup: Setup) -> None:
    schema = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"],
              "additionalProperties": False}
    client = openai.OpenAI(base_url=setup.gateway.url + "/v1", api_key="sk-team-a")
    for stream in (False, True):
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Pet?"}], max_tokens=32, stream=stream,
            response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}})
        text = "".join(c.choices[0].delta.content or "" for c in reply if c.choices) if stream else \
            reply.choices[0].message.content
        assert json.loads(text)["kind"] in ("cat", "dog")  # tiny's random weights, held to the schema
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):  # the server's 400 passes through too
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "s", "schema": {"type": "array", "uniqueItems": True}}})


def test_the_gateway_reads_the_servers_load_report(setup: Setup) -> None:
    pod = setup.server.base_url.removeprefix("http://")

    def ages() -> list[str]:
        return [line for line in httpx.get(setup.gateway.url + "/metrics").text.splitlines()
                if line.startswith("flotilla_gateway_pod_load") and f'pod="{pod}"' in line and "age_seconds" in line]

    deadline = time.monotonic() + 30  # hang-only: the board reads every pod within a poll interval of seeing it
    while not ages():
        assert time.monotonic() < deadline, "the gateway never read the server's load report"
        time.sleep(0.1)
    assert len(ages()) == 1 and 0 <= float(ages()[0].rsplit(" ", 1)[1]) < 1  # read, and fresh


@pytest.mark.parametrize(("key", "model", "status"), [
    (None, "tiny", 401), ("sk-wrong", "tiny", 401), ("sk-team-b", "tiny", 403),
])
def test_bad_keys_never_reach_a_server(setup: Setup, key: str | None, model: str, status: int) -> None:
    before = setup.server.metric("flotilla_requests_total", code="200")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(setup.gateway.url + "/v1/chat/completions", headers=headers,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == status
    assert r.json()["error"]["type"] == {401: "authentication_error", 403: "permission_error"}[status]
    assert setup.server.metric("flotilla_requests_total", code="200") == before


def test_the_tenant_comes_from_the_key(setup: Setup) -> None:
    r = httpx.post(setup.gateway.url + "/v1/chat/completions",
                   headers={"Authorization": "Bearer sk-team-b", "X-Flotilla-Tenant": "team-a",
                            "X-Flotilla-Class": "interactive"},
                   json={"model": "probe", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                         "cache_salt": "team-a"})
    assert r.status_code == 200
    state = setup.pods.states[setup.probe]
    headers = {k.lower(): v for k, v in state.last_headers.items()}
    assert headers["x-flotilla-tenant"] == "team-b"  # replaced, not passed on
    assert headers["x-flotilla-class"] == "batch"  # the key's class, not the client's
    assert headers["authorization"] == f"Bearer {SERVER_KEY}"  # the servers' key, never the client's
    assert state.last_body["cache_salt"] == "team-b"  # no probing another tenant's prefix cache
    metrics = httpx.get(setup.gateway.url + "/metrics").text
    assert 'model="probe",model_namespace="default",route="/v1/chat/completions",tenant="team-b"} 1.0' in metrics


def test_disconnects_through_the_gateway_free_the_kv(setup: Setup) -> None:
    async def leave(i: int) -> None:
        async with httpx.AsyncClient(timeout=30) as client, client.stream(
                "POST", setup.gateway.url + "/v1/completions", headers={"Authorization": "Bearer sk-team-a"},
                json={"model": "tiny", "prompt": f"story {i}", "max_tokens": 1500, "ignore_eos": True,
                      "stream": True}) as r:  # it cannot end by itself before the client leaves
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    return  # leave after the first token

    async def all_leave() -> None:
        await asyncio.gather(*(leave(i) for i in range(10)))

    gone_before = setup.server.metric("flotilla_requests_total", code="499")
    asyncio.run(all_leave())
    deadline = time.monotonic() + 10
    while setup.server.metric("flotilla_kv_blocks_used") != 0 or setup.server.metric("flotilla_requests_running"):
        assert time.monotonic() < deadline, "the server still holds KV blocks after the clients left"
        time.sleep(0.1)
    assert setup.server.metric("flotilla_requests_total", code="499") - gone_before == 10  # cancelled, not finished
