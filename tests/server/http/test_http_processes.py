"""`--http-processes 2`, seen from outside: two HTTP processes share the port over one engine process; they
answer as one server (the same tokens, one merged /metrics, the whole queue in the load report, 429s with
Retry-After under a burst), drain together on SIGTERM, fail together when the engine dies, and leave no
process behind when their parent is SIGKILLed (flotilla_server/fronts.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.http.server_process import REPO, run_server, start_streams
from tests.server.http.test_engine_process import _ready, alive, children, wait_until
from tests.support.ports import free_port

pytestmark = pytest.mark.serial  # deadlines after signals and kills

FLAGS = ("--http-processes", "2", "--max-model-len", "512")


def descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def http_pids(log: str) -> list[int]:
    return [int(p) for p in re.search(r"2 HTTP processes \((\d+), (\d+)\)", log).groups()]


def engine_pid(log: str) -> int:
    return int(re.search(r"over the engine in process (\d+)", log)[1])


def test_two_http_processes_answer_as_one_server(tmp_path) -> None:
    with run_server(*FLAGS, "--max-num-seqs", "4", "--queue-depth-per-slot", "2", tmp_path=tmp_path) as s:
        fronts, engine = http_pids(s.log()), engine_pid(s.log())
        assert set(fronts) | {engine} <= set(descendants(s.proc.pid))
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)

        def complete(_: int) -> str:
            return client.completions.create(model="tiny", prompt="the same prompt", max_tokens=8,
                                             temperature=0).choices[0].text

        alone = complete(0)
        with ThreadPoolExecutor(4) as pool:  # 16 connections: the kernel spreads them over both processes
            texts = list(pool.map(complete, range(16)))
        assert texts == [alone] * 16
        for _ in range(6):  # whichever process answers, /metrics counts both processes' requests
            assert s.metric("flotilla_requests_total", code="200") == 17
        load = httpx.get(f"{s.base_url}/flotilla/v1/load", timeout=5).json()
        assert load["queue_capacity"] == 8 and load["slots"] == 4 and load["ready"] is True

        # a burst against 4 slots and 8 places: every answer is a stream or a 429 with Retry-After
        body = {"model": "tiny", "prompt": "a crowd", "max_tokens": 64, "ignore_eos": True}
        with ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(lambda _: httpx.post(f"{s.base_url}/v1/completions", json=body, timeout=60),
                                    range(40)))
        codes = [a.status_code for a in answers]
        assert set(codes) <= {200, 429} and codes.count(429) > 0, codes
        for refused in (a for a in answers if a.status_code == 429):
            assert int(refused.headers["retry-after"]) >= 1 and refused.json()["error"]["code"] == "queue_full"
        assert s.metric("flotilla_rejections_total", reason="queue_full") == codes.count(429)
        wait_until(lambda: s.metric("flotilla_kv_blocks_used") == 0, 10, "KV blocks stayed in use")


def test_sigterm_drains_both_http_processes_then_everything_exits_0(tmp_path) -> None:
    with run_server(*FLAGS, tmp_path=tmp_path) as s:
        everyone = descendants(s.proc.pid)
        streams = start_streams(s.base_url, 4, 300)
        s.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: not _ready(int(s.base_url.rsplit(":", 1)[1])), 5, "/readyz stayed 200 while draining")
        streams.join(60)
        assert s.proc.wait(timeout=30) == 0
        assert len(streams.endings) == 4, streams.endings
        assert all('"finish_reason":"length"' in e for e in streams.endings), streams.endings
        wait_until(lambda: not any(alive(p) for p in everyone), 5, "a process outlived the drained server")


def test_a_killed_engine_fails_the_streams_and_every_process_exits(tmp_path) -> None:
    with run_server(*FLAGS, tmp_path=tmp_path) as s:
        everyone = descendants(s.proc.pid)
        streams = start_streams(s.base_url, 4, 450)
        os.kill(engine_pid(s.log()), signal.SIGKILL)
        streams.join(20)
        assert s.proc.wait(timeout=20) == 1
        assert len(streams.endings) == 4
        for ending in streams.endings:
            assert '"engine_error"' in ending and ending.endswith("data: [DONE]"), ending
        wait_until(lambda: not any(alive(p) for p in everyone), 5, "a process outlived the failed server")


def test_sigkill_of_the_parent_leaves_no_process() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", "tiny", "--host", "127.0.0.1",
           "--port", str(port), *FLAGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        wait_until(lambda: proc.poll() is not None or _ready(port), 120, "the server never became ready")
        everyone = descendants(proc.pid)
        assert len(everyone) >= 3  # the engine and two HTTP processes
        proc.kill()
        proc.wait()
        wait_until(lambda: not any(alive(p) for p in everyone), 5, f"{everyone} outlived their parent by 5 s")
        assert not Path(f"/proc/{proc.pid}").exists() or not alive(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_http_process_stops_the_server_with_exit_1(tmp_path) -> None:
    with run_server(*FLAGS, tmp_path=tmp_path) as s:
        everyone = descendants(s.proc.pid)
        os.kill(http_pids(s.log())[0], signal.SIGKILL)
        assert s.proc.wait(timeout=20) == 1  # the other was cut off and stopped: Kubernetes restarts the pod
        wait_until(lambda: not any(alive(p) for p in everyone), 5, "a process outlived the failed server")
        assert "exited with code -9: stopping the others; exiting 1" in s.log()
