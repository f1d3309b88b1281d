"""The engine in its own process, seen from outside: a killed engine fails loudly (503, errors, exit 1), a
killed HTTP process leaves no orphan, and the pool is sized and logged at start-up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.http.server_process import REPO, run_server, start_streams
from tests.support.ports import free_port

pytestmark = pytest.mark.serial  # deadlines after killing a process


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def engine_pid(log: str) -> int:
    return int(re.search(r"the engine runs in process (\d+)", log)[1])


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_killed_engine_makes_readyz_503_fails_the_streams_and_exits_1(tmp_path) -> None:
    with run_server("--max-model-len", "512", tmp_path=tmp_path) as s:
        engine = engine_pid(s.log())
        assert engine in children(s.proc.pid)
        streams = start_streams(s.base_url, 3, 450, timeout_s=30)
        os.kill(engine, signal.SIGKILL)
        wait_until(lambda: httpx.get(f"{s.base_url}/readyz", timeout=5).status_code == 503, 5, "/readyz stayed 200")
        assert httpx.get(f"{s.base_url}/readyz", timeout=5).json() == {"status": "engine_dead"}
        streams.join(20)
        assert s.proc.wait(timeout=20) == 1
        assert len(streams.endings) == 3
        for ending in streams.endings:
            assert '"engine_error"' in ending and ending.endswith("data: [DONE]"), ending
        assert "every request in flight fails" in s.log()


def test_sigkill_of_the_http_process_leaves_no_engine_process() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", "tiny", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        wait_until(lambda: proc.poll() is not None or _ready(port), 120, "the server never became ready")
        kids = children(proc.pid)  # the engine, and multiprocessing's resource tracker
        assert kids
        proc.kill()
        proc.wait()
        started = time.monotonic()
        wait_until(lambda: not any(alive(k) for k in kids), 5, f"children {kids} outlived their parent by 5 s")
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_default_pool_is_logged_as_tokens_and_concurrency(server) -> None:
    line = next(x for x in server.log().splitlines() if "KV pool:" in x)
    m = re.search(r"(\d+) blocks = (\d+) tokens .*; ([\d.]+) sequences at the full --max-model-len of (\d+)", line)
    assert m, line
    blocks, tokens, concurrency, max_len = int(m[1]), int(m[2]), float(m[3]), int(m[4])
    assert tokens == blocks * 16 and max_len == 512
    assert concurrency == pytest.approx(tokens / max_len, abs=0.01)
    assert tokens <= 64 * 512  # on CPU the default never exceeds every slot at the context limit
    load = httpx.get(f"{server.base_url}/flotilla/v1/load", timeout=5).json()
    assert load["slots"] == 64


def test_an_impossible_max_model_len_is_refused_naming_the_flag(tmp_path) -> None:
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", "tiny", "--port", str(free_port()),
           "--num-kv-blocks", "4", "--max-model-len", "1024"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert "--max-model-len 1024 does not fit" in done.stderr and "lower --max-model-len" in done.stderr
    assert "Traceback" not in done.stderr




@pytest.mark.parametrize(("model", "expected"), [
    ("tiny", "error: --quantization gguf keeps a .gguf file's blocks, and 'tiny' is not a .gguf file"),
    ("/nowhere/m.Q4_1.gguf", "error: GGUF file /nowhere/m.Q4_1.gguf not found"),
])
def test_a_quantization_the_model_cannot_take_exits_2_in_one_line(model, expected) -> None:
    cmd = [sys.executable, "-m", "flotilla_server.cli", "--model", model, "--quantization", "gguf",
           "--port", str(free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
