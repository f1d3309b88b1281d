"""The door in the HTTP protocol, on a real server: with the queue full, a generation request is refused from
its headers alone (429, Retry-After, the connection closed before its body is read); a request without the
API key still gets 401, never the load; and every place a request takes at the door comes back, so the
server admits again once its load leaves."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlparse

import httpx

from tests.server.http import raw_http
from tests.server.http.server_process import run_server

KEY = "sk-door-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
HOLD = {"model": "tiny", "prompt": "hold the slot", "max_tokens": 2000, "ignore_eos": True}  # seconds on tiny


def test_door_refuses_from_headers_keeps_the_key_first_and_returns_its_places(tmp_path):
    # 1 slot and 1 queue place: the door lets 2 requests in at a time
    with run_server("--max-num-seqs", "1", "--queue-depth-per-slot", "1", "--queue-timeout-s", "30",
                    "--max-model-len", "2048", env={"FLOTILLA_API_KEY": KEY}, tmp_path=tmp_path) as server:
        url = urlparse(server.base_url)
        host, port = url.hostname, url.port

        async def hold_two() -> list[asyncio.StreamWriter]:
            """One request in the slot, then one in the queue place."""
            writers = []
            for running, waiting in ((1, 0), (1, 1)):
                _, writer = await raw_http.connect(host, port)
                writer.write(raw_http.request_bytes(host, port, "/v1/completions", HOLD, extra_headers=AUTH))
                writers.append(writer)
                for _ in range(100):
                    if (server.metric("flotilla_requests_running"), server.metric("flotilla_requests_waiting")) == (
                            running, waiting):
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(f"expected {running} running and {waiting} waiting: {server.log()}")
            return writers

        async def refused_from_headers() -> raw_http.RawResponse:
            # the head promises a body that never comes: only a door that answers from headers can answer it
            reader, writer = await raw_http.connect(host, port)
            head = raw_http.request_bytes(host, port, "/v1/completions", b"x" * 100_000, extra_headers=AUTH)
            writer.write(head.split(b"\r\n\r\n")[0] + b"\r\n\r\n")
            resp = await asyncio.wait_for(raw_http.read_rest(reader, await raw_http.read_head(reader, 0.0)), 5)
            assert await reader.read() == b""  # the server closed the connection
            writer.close()
            return resp

        async def scenario() -> None:
            for _round in range(2):  # the second round needs both places back
                holders = await hold_two()
                resp = await refused_from_headers()
                assert resp.status == 429 and resp.headers["retry-after"] == "30"
                assert resp.headers["connection"] == "close"
                error = json.loads(resp.body)["error"]
                assert error["code"] == "queue_full" and "retry after 30 s" in error["message"]
                keyless = await raw_http.post(host, port, "/v1/completions", HOLD)
                assert keyless.status == 401, keyless.body  # no key learns the load
                many = await asyncio.gather(*(raw_http.post(host, port, "/v1/chat/completions", {
                    "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                    extra_headers=AUTH) for _ in range(20)))
                assert [r.status for r in many] == [429] * 20
                for writer in holders:  # the clients leave: their slot and queue place free
                    writer.close()
                for _ in range(100):
                    if server.metric("flotilla_requests_running") == 0 and server.metric("flotilla_requests_waiting") == 0:
                        break
                    await asyncio.sleep(0.05)

        asyncio.run(scenario())
        assert server.metric("flotilla_requests_total", code="429") == 2 * 21
        with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=30) as client:
            answered = client.post("/v1/completions", json={**HOLD, "max_tokens": 3})
            assert answered.status_code == 200 and answered.json()["usage"]["completion_tokens"] == 3
