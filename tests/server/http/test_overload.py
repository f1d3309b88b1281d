"""Overload: 200 simultaneous requests against 4 slots and a queue of 32.

The excess gets 429 + Retry-After at once, queued requests that wait past --queue-timeout-s get 429,
every admitted request completes, /healthz stays fast, and the waiting gauge shows the queue.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlparse

import pytest

from tests.server.http import raw_http
from tests.server.http.server_process import run_server

pytestmark = pytest.mark.serial  # 429 and /healthz latency bounds

SLOTS, DEPTH_PER_SLOT, QUEUE_TIMEOUT_S = 4, 8, 2
NUM_REQUESTS, MAX_TOKENS = 200, 300


@pytest.fixture(scope="module")
def overload_server(tmp_path_factory):
    with run_server("--max-num-seqs", str(SLOTS), "--queue-depth-per-slot", str(DEPTH_PER_SLOT),
                    "--queue-timeout-s", str(QUEUE_TIMEOUT_S), "--max-model-len", "1024",
                    tmp_path=tmp_path_factory.mktemp("overload")) as s:
        yield s


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from /metrics")


def test_overload(overload_server):
    url = urlparse(overload_server.base_url)
    host, port = url.hostname, url.port

    async def go():
        conns = [await raw_http.connect(host, port) for _ in range(NUM_REQUESTS)]
        stop = asyncio.Event()
        health_s: list[float] = []
        waiting_seen: list[tuple[float, float]] = []

        async def poll_health():
            while not stop.is_set():
                r = await raw_http.post(host, port, "/healthz", b"", method="GET")
                assert r.status == 200
                health_s.append(r.status_after_s)
                await asyncio.sleep(0.02)

        async def poll_metrics():
            while not stop.is_set():
                r = await raw_http.post(host, port, "/metrics", b"", method="GET")
                text = r.body.decode()
                waiting_seen.append((_gauge(text, "flotilla_requests_waiting"),
                                     _gauge(text, "vllm:num_requests_waiting")))
                await asyncio.sleep(0.1)

        await raw_http.post(host, port, "/v1/completions", {"model": "tiny", "prompt": "warm", "max_tokens": 2})
        pollers = [asyncio.create_task(poll_health()), asyncio.create_task(poll_metrics())]
        await asyncio.sleep(0.3)
        body = {"model": "tiny", "prompt": "a crowd arrives at once", "max_tokens": MAX_TOKENS, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        sent_at = []
        for i, (_, writer) in enumerate(conns):
            writer.write(raw_http.request_bytes(host, port, "/v1/completions", {**body, "seed": i}))
            sent_at.append(time.monotonic())

        async def answer(i: int):
            reader, writer = conns[i]
            resp = await raw_http.read_rest(reader, await raw_http.read_head(reader, sent_at[i]))
            writer.close()
            return resp

        results = await asyncio.gather(*(answer(i) for i in range(NUM_REQUESTS)))
        stop.set()
        await asyncio.gather(*pollers)
        return results, health_s, waiting_seen

    results, health_s, waiting_seen = asyncio.run(go())
    by_code: dict[str, list] = {}
    for r in results:
        code = "200" if r.status == 200 else json.loads(r.body)["error"]["code"]
        by_code.setdefault(code, []).append(r)
    full, timed_out, ok = by_code.get("queue_full", []), by_code.get("queue_timeout", []), by_code.get("200", [])
    assert set(by_code) <= {"200", "queue_full", "queue_timeout"}, {k: len(v) for k, v in by_code.items()}
    # everyone beyond 4 running + 32 queued is refused at the door
    assert NUM_REQUESTS - SLOTS - SLOTS * DEPTH_PER_SLOT <= len(full) <= NUM_REQUESTS - SLOTS - SLOTS * DEPTH_PER_SLOT + 8
    for r in full + timed_out:
        assert r.status == 429 and r.headers["retry-after"] == str(QUEUE_TIMEOUT_S)
    # 429 at once, measured from the request's bytes being written: the door answers from the headers
    # (http/door_protocol.py), ~20 ms a refusal (docs/benchmarks.md, "Engine modes"). Measured 2026-12-04 on a
    # quiet 2-core machine: median 8-11 ms, slowest 40-46 ms. A server that queued or parsed the excess would take
    # seconds here; 100 ms for the median and the p95 leaves room for a loaded machine.
    full_s = sorted(r.status_after_s for r in full)
    median_s, p95_s = full_s[len(full_s) // 2], full_s[int(0.95 * (len(full_s) - 1))]
    assert median_s < 0.1, f"median queue-full 429 after {median_s * 1000:.0f} ms"
    assert p95_s < 0.1, f"p95 queue-full 429 after {p95_s * 1000:.0f} ms"
    assert full_s[-1] < 0.5, f"the slowest queue-full 429 took {full_s[-1] * 1000:.0f} ms"
    assert timed_out, "with 32 queued and ~4 admitted per generation time, some must wait past the timeout"
    for r in timed_out:
        assert QUEUE_TIMEOUT_S - 0.05 <= r.status_after_s < QUEUE_TIMEOUT_S + 1.0
    assert len(ok) >= SLOTS
    for r in ok:  # every admitted request completes
        assert r.done and r.events[-2]["choices"][0]["finish_reason"] == "length"
        assert r.events[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    # /healthz: the 100 ms bound holds for nearly every probe; the one probe that lands inside the burst waits
    # behind ~200 request parses, which on this shared 2-core machine (load 3-8) can pass 100 ms
    health_sorted = sorted(health_s)
    p90_s = health_sorted[int(0.9 * (len(health_sorted) - 1))]
    assert len(health_s) >= 10 and p90_s < 0.1, f"/healthz p90 {p90_s * 1000:.0f} ms"
    assert max(health_s) < 0.5, f"/healthz slowest {max(health_s) * 1000:.0f} ms"
    peak = max(w for w, _ in waiting_seen)
    assert peak >= SLOTS * DEPTH_PER_SLOT / 2, waiting_seen
    assert max(v for _, v in waiting_seen) == peak
    m = overload_server.metrics()
    assert m[("flotilla_rejections_total", (("reason", "queue_full"),))] == len(full)
    assert m[("flotilla_rejections_total", (("reason", "queue_timeout"),))] == len(timed_out)
    assert m[("flotilla_kv_blocks_used", ())] == 0 and m[("flotilla_requests_waiting", ())] == 0
