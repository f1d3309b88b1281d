"""GET /flotilla/v1/load on a real server: correct when idle and under load, fast while the engine works,
and ready=false while draining (that one in test_drain.py; docs/architecture.md, "Load report")."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest
from flotilla_contract.load import LOAD_PATH, ServerLoad

from tests.server.http.server_process import run_server

pytestmark = pytest.mark.serial  # a latency bound on /flotilla/v1/load under load

SLOTS, DEPTH_PER_SLOT, REQUESTS = 2, 4, 6


def get_load(client: httpx.Client) -> ServerLoad:
    r = client.get(LOAD_PATH)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    return ServerLoad.model_validate_json(r.content)


def test_load_idle_and_busy(tmp_path):
    with run_server("--max-num-seqs", str(SLOTS), "--queue-depth-per-slot", str(DEPTH_PER_SLOT),
                    "--max-model-len", "512", "--served-model-name", "sea", tmp_path=tmp_path) as server, \
            httpx.Client(base_url=server.base_url, timeout=10) as client:
        idle = get_load(client)
        assert idle.ready and (idle.waiting, idle.running, idle.kv_usage) == (0, 0, 0.0)
        assert (idle.slots, idle.queue_capacity) == (SLOTS, SLOTS * DEPTH_PER_SLOT)
        assert [(m.name, m.state) for m in idle.models] == [("sea", "loaded")]

        async def busy() -> tuple[list[ServerLoad], list[float]]:
            body = {"model": "sea", "prompt": "the sea", "max_tokens": 400, "ignore_eos": True}
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as ac:
                tasks = [asyncio.create_task(ac.post("/v1/completions", json=body)) for _ in range(REQUESTS)]
                seen, took_s = [], []
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and len(took_s) < 40:
                    start = time.perf_counter()
                    r = await ac.get(LOAD_PATH)
                    took_s.append(time.perf_counter() - start)
                    seen.append(ServerLoad.model_validate_json(r.content))
                    await asyncio.sleep(0.05)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                return seen, took_s

        seen, took_s = asyncio.run(busy())
        full = [s for s in seen if s.running == SLOTS]
        assert full, f"never saw every slot busy: {seen[-3:]}"
        assert any(s.waiting == REQUESTS - SLOTS and s.kv_usage > 0 for s in full), full[-3:]
        for s in seen:
            # a request counts as waiting from its submission until the engine process's admission comes back
            assert s.running <= SLOTS and s.waiting <= REQUESTS and s.models[0].running == s.running
        # light: answered between engine steps, never behind a forward pass
        assert statistics.median(took_s) < 0.05, sorted(took_s)
