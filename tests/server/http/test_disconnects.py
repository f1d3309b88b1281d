"""100 clients leave at random points (queued, before the first token, mid-stream): every block comes back,
each departure is counted as client_gone (499), and nothing is a server error."""

from __future__ import annotations

import asyncio
import random
import time
from urllib.parse import urlparse

from tests.server.http import raw_http


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _summary(server, gone_before: float) -> str:
    """The figures settled() reads, by name, instead of the whole (truncated) metrics dict."""
    m = server.metrics()
    return str({"kv_blocks_used": m.get(("flotilla_kv_blocks_used", ())), "running": m.get(("flotilla_requests_running", ())),
            "waiting": m.get(("flotilla_requests_waiting", ())),
            "client_gone": m.get(("flotilla_rejections_total", (("reason", "client_gone"),)), 0) - gone_before,
            "codes": {k[1][0][1]: v for k, v in m.items() if k[0] == "flotilla_requests_total"}})


def test_random_disconnects_free_everything(server):
    url = urlparse(server.base_url)
    gone_before = server.metric("flotilla_rejections_total", reason="client_gone")
    rng = random.Random(7)
    plans = [("events", rng.randint(1, 40)) if i % 10 < 7 else ("seconds", rng.uniform(0.1, 0.4))
             for i in range(100)]

    def arrived() -> float:
        """Requests the server holds or has answered: a request still in the kernel's buffer when its client
        resets the connection never reaches the server, so leaving starts only once all 100 have arrived."""
        m = server.metrics()
        answered = sum(v for k, v in m.items() if k[0] == "flotilla_requests_total")
        return (m.get(("flotilla_requests_running", ()), 0) + m.get(("flotilla_requests_waiting", ()), 0)
                + answered - answered_before)

    answered_before = sum(v for k, v in server.metrics().items() if k[0] == "flotilla_requests_total")

    async def all_arrived() -> None:
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(arrived) < 100:
            assert time.monotonic() < deadline, _summary(server, gone_before)
            await asyncio.sleep(0.05)

    async def client(i: int, plan: tuple[str, float], everyone_in: asyncio.Future) -> str:
        kind, amount = plan
        body = {"model": "tiny", "prompt": f"client {i} reads a while", "max_tokens": 400, "ignore_eos": True,
                "stream": i % 2 == 0}
        reader, writer = await raw_http.connect(url.hostname, url.port)
        writer.write(raw_http.request_bytes(url.hostname, url.port, "/v1/completions", body))
        await writer.drain()
        try:
            if kind == "seconds" or not body["stream"]:
                await everyone_in
                await asyncio.sleep(amount if kind == "seconds" else amount / 100)
                return "left while waiting"
            resp = await raw_http.read_head(reader, time.monotonic())
            assert resp.status == 200
            seen = 0
            while seen < amount:
                line = await reader.readline()
                seen += line.startswith(b"data: {")
            return "left mid-stream"
        finally:
            if i % 3 == 0:
                writer.transport.abort()  # RST instead of FIN: the rudest way to leave
            else:
                writer.close()

    async def go():
        everyone_in = asyncio.ensure_future(all_arrived())
        outcomes = await asyncio.gather(*(client(i, p, everyone_in) for i, p in enumerate(plans)))
        await everyone_in
        return outcomes

    outcomes = asyncio.run(go())
    assert len(outcomes) == 100

    def settled() -> bool:
        m = server.metrics()
        return (m.get(("flotilla_kv_blocks_used", ()), -1) == 0 and m.get(("flotilla_requests_running", ()), -1) == 0
                and m.get(("flotilla_requests_waiting", ()), -1) == 0
                and m.get(("flotilla_rejections_total", (("reason", "client_gone"),)), 0) - gone_before >= 100)

    # a hang guard: on a loaded CI machine the last departures are noticed (a failed write, a disconnect) only
    # after more steps; 20 s once ran out while SmolLM2 tests ran beside this one (make test, 2 cores)
    assert _wait_for(settled, timeout_s=60), _summary(server, gone_before)
    assert server.metric("flotilla_rejections_total", reason="client_gone") - gone_before == 100
    m = server.metrics()
    assert not [k for k in m if k[0] == "flotilla_requests_total" and k[1][0][1].startswith("5")], m
    log = server.log()
    assert "Traceback" not in log and " 500 " not in log and "ERROR" not in log
