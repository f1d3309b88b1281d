"""SIGTERM during 8 streams: readiness drops at once, new requests get 503, the 8 finish whole, exit status 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from urllib.parse import urlparse

import pytest
from flotilla_contract.load import LOAD_PATH, ServerLoad

from tests.server.http import raw_http
from tests.server.http.server_process import run_server

pytestmark = pytest.mark.slow  # tens of seconds here; -m 'not slow' skips it

STREAMS, MAX_TOKENS = 8, 300


def test_sigterm_drains_in_flight_streams(tmp_path):
    with run_server("--max-num-seqs", "8", "--max-model-len", "512", "--drain-timeout-s", "30",
                    tmp_path=tmp_path) as server:
        url = urlparse(server.base_url)
        host, port = url.hostname, url.port

        async def go():
            started = [asyncio.Event() for _ in range(STREAMS)]

            async def stream(i: int) -> raw_http.RawResponse:
                body = {"model": "tiny", "prompt": f"stream {i}", "max_tokens": MAX_TOKENS, "ignore_eos": True,
                        "stream": True, "stream_options": {"include_usage": True}}
                reader, writer = await raw_http.connect(host, port)
                writer.write(raw_http.request_bytes(host, port, "/v1/completions", body))
                resp = await raw_http.read_head(reader, time.monotonic())
                started[i].set()
                await raw_http.read_rest(reader, resp)
                writer.close()
                return resp

            tasks = [asyncio.create_task(stream(i)) for i in range(STREAMS)]
            await asyncio.gather(*(e.wait() for e in started))
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            ready = await raw_http.post(host, port, "/readyz", b"", method="GET")
            load = await raw_http.post(host, port, LOAD_PATH, b"", method="GET")
            refused = await raw_http.post(host, port, "/v1/completions",
                                          {"model": "tiny", "prompt": "late", "max_tokens": 4})
            health = await raw_http.post(host, port, "/healthz", b"", method="GET")
            results = await asyncio.gather(*tasks)
            return ready, load, refused, health, results

        ready, load, refused, health, results = asyncio.run(go())
        assert ready.status == 503 and json.loads(ready.body)["status"] == "draining"
        report = ServerLoad.model_validate_json(load.body)
        assert load.status == 200 and not report.ready and report.running == STREAMS  # the gateway stops sending
        assert refused.status == 503 and json.loads(refused.body)["error"]["code"] == "draining"
        assert health.status == 200  # alive while draining: liveness must not kill a draining pod
        for r in results:
            assert r.status == 200 and r.done
            assert r.events[-2]["choices"][0]["finish_reason"] == "length"
            assert r.events[-1]["usage"]["completion_tokens"] == MAX_TOKENS
        assert server.proc.wait(timeout=30) == 0
        assert "draining" in server.log()


def test_drain_timeout_cuts_off_with_an_error_chunk_and_exits_0(tmp_path):
    with run_server("--max-model-len", "2048", "--drain-timeout-s", "1", tmp_path=tmp_path) as server:
        url = urlparse(server.base_url)
        host, port = url.hostname, url.port

        async def go():
            body = {"model": "tiny", "prompt": "a long one", "max_tokens": 2000, "ignore_eos": True}
            whole = asyncio.create_task(raw_http.post(host, port, "/v1/completions", body))
            await asyncio.sleep(0.3)  # admitted (64 free slots) before the stream and the signal
            reader, writer = await raw_http.connect(host, port)
            writer.write(raw_http.request_bytes(host, port, "/v1/completions", {**body, "stream": True}))
            resp = await raw_http.read_head(reader, time.monotonic())
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await raw_http.read_rest(reader, resp)
            return resp, time.monotonic() - signalled, await whole

        resp, cut_after_s, whole = asyncio.run(go())
        assert resp.done and resp.events[-1]["error"]["code"] == "draining"
        assert 0.9 < cut_after_s < 5
        assert whole.status == 503 and json.loads(whole.body)["error"]["code"] == "draining"
        assert (whole.headers["retry-after"], whole.headers["connection"]) == ("1", "close")
        assert server.proc.wait(timeout=10) == 0


def test_a_second_signal_cuts_off_at_once_counted_as_draining_without_a_traceback(tmp_path):
    with run_server("--drain-timeout-s", "60", tmp_path=tmp_path) as server:
        url = urlparse(server.base_url)
        host, port = url.hostname, url.port

        async def go():
            body = {"model": "tiny", "prompt": "a long one", "max_tokens": 2000, "ignore_eos": True}
            whole = asyncio.create_task(raw_http.post(host, port, "/v1/completions", body))
            reader, writer = await raw_http.connect(host, port)
            writer.write(raw_http.request_bytes(host, port, "/v1/completions", {**body, "stream": True}))
            resp = await raw_http.read_head(reader, time.monotonic())
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await raw_http.read_rest(reader, resp)
            return resp, time.monotonic() - signalled, await whole

        resp, cut_after_s, whole = asyncio.run(go())
        assert cut_after_s < 5  # not the 60 s drain timeout
        assert resp.done and resp.events[-1]["error"]["code"] == "draining"
        assert whole.status == 503 and whole.headers["retry-after"] == "1"
        assert server.proc.wait(timeout=10) == 0
        log = server.log()
        assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]


def test_the_drain_log_line_shows_the_timeout_as_set():
    from flotilla_server.http.serve import drain_started_message

    assert drain_started_message("SIGTERM", 2, 0.5).endswith("up to 0.5 s")
    assert drain_started_message("SIGTERM", 0, 30.0).endswith("up to 30 s")
