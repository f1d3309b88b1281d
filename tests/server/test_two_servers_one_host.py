"""Two `flotilla-server --model <SmolLM2 GGUF>` with no sizing flags, started at once on one host with no
memory limit, both fit: each serves chat, and with its KV pool more than half full, each server's processes
together hold less than half of the machine's memory (PSS, so pages the two share are split between them).

Why: the default CPU pool was once 0.9 × MemAvailable less the weights, ~20 GiB of a 24 GiB host for
SmolLM2, zeroed and so resident at once; a second server on the host took the same. With no memory limit the
default pool is now at most a quarter of MemAvailable and 1 GiB (engine/pool_sizing.py; docs/serving.md, "KV
cache").

Blocks fill only as fast as prefill computes them, so the test's time is mostly FILL_TARGET of each pool's
tokens of prefill: each server's 64 slots take one prompt each, their decodes outlasting the other prompts'
prefill so that every slot holds its blocks at once.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from flotilla_contract.flags import DEFAULT_MAX_NUM_SEQS
from flotilla_contract.metrics import KV_BLOCKS_TOTAL, KV_CACHE_USAGE_RATIO
from flotilla_server.engine.pool_sizing import SHARED_HOST_SOURCE, SLOTS_SOURCE

from tests.server.http.server_process import ServerProcess, run_server
from tests.server.model.gguf_reference import smollm2_gguf
from tests.support.processes import descendants, pss_bytes

# ~85 CPU-seconds of prefill (a fifth of the concurrent pass's CPU): `make bench` runs it (issue 41: long soaks
# move there); the sizing rule itself is tested as a pure function in make test (engine/test_pool_sizing.py).
# Not `serial`: PSS counts each server's own pages (others' processes only split the shared libraries further),
# and the pool is 1 GiB whenever MemAvailable is over 4 GiB, so it may run beside other work
pytestmark = [pytest.mark.slow, pytest.mark.soak]

NAME = "smollm2-135m-instruct"
BLOCK_SIZE = 16  # the default --block-size
FILL_TARGET = 0.55  # of each pool's tokens, in prompts and outputs held at once
FILL_FLOOR = 0.5  # what the usage gauge must have reached
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # SmolLM2: 30 layers × K and V × 3 KV heads × 64 dims × float32


def mem_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def chat(server: ServerProcess) -> str:
    body = {"model": NAME, "max_tokens": 8, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def fill(server: ServerProcess, pool: ThreadPoolExecutor, salt: int) -> list:
    """One request per slot, together holding FILL_TARGET of the pool: distinct prompts (no shared prefix
    blocks) and enough output tokens that the first to finish prefill still decodes when the last does."""
    tokens = int(FILL_TARGET * server.metric(KV_BLOCKS_TOTAL) * BLOCK_SIZE / DEFAULT_MAX_NUM_SEQS)
    max_tokens = tokens // 32 + 16  # ≥ the steps of every slot's prefill (64 prompts, 2,048 tokens a step), and
    # some more: every slot holds its blocks for several polls
    prompt_len = tokens - max_tokens

    def one(i: int) -> None:
        prompt = [100 + (salt * 7919 + i * 131 + j * 7) % 49000 for j in range(prompt_len)]
        body = {"model": NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
        r = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
        assert r.status_code == 200, r.text

    return [pool.submit(one, i) for i in range(DEFAULT_MAX_NUM_SEQS)]


@pytest.mark.timeout(900)
def test_two_default_servers_started_together_each_hold_under_half_the_memory(tmp_path) -> None:
    model = smollm2_gguf()
    half_bytes = mem_total_bytes() // 2
    started_at = time.monotonic()
    starts = [run_server(tmp_path=tmp_path, startup_timeout_s=300, model_args=("--model", str(model)))
              for _ in range(2)]
    # the servers stop first on a failure: the requests still in flight then end at once
    with ThreadPoolExecutor(2 + 2 * DEFAULT_MAX_NUM_SEQS) as pool, contextlib.ExitStack() as stack:
        entering = [pool.submit(cm.__enter__) for cm in starts]  # both read MemAvailable before either allocates
        for cm, future in zip(starts, entering, strict=True):
            with contextlib.suppress(Exception):
                future.result()
                stack.push(cm.__exit__)  # stopped even if the other failed to start
        servers = [future.result() for future in entering]
        for s in servers:
            assert f"sized by {SHARED_HOST_SOURCE}" in s.log() or f"sized by {SLOTS_SOURCE}" in s.log(), s.log()
            assert chat(s).strip()
        ready_s = time.monotonic() - started_at
        requests = [r for i, s in enumerate(servers) for r in fill(s, pool, i)]
        peak_usage, peak_pss = [0.0, 0.0], [0, 0]
        while not all(r.done() for r in requests):
            for i, s in enumerate(servers):
                peak_usage[i] = max(peak_usage[i], s.metric(KV_CACHE_USAGE_RATIO))
                peak_pss[i] = max(peak_pss[i], pss_bytes(s.proc.pid))
            time.sleep(1.0)
        for r in requests:
            r.result()
        after = [pss_bytes(s.proc.pid) for s in servers]
        report = (f"ready after {ready_s:.0f} s, filled after {time.monotonic() - started_at:.0f} s; MemTotal/2 "
                  f"{half_bytes / 2**30:.2f} GiB; peak KV usage {[round(u, 2) for u in peak_usage]}; PSS GiB peak "
                  f"{[round(p / 2**30, 2) for p in peak_pss]}, after {[round(p / 2**30, 2) for p in after]}")
        print(report)
        assert min(peak_usage) >= FILL_FLOOR, report
        assert max(*peak_pss, *after) < half_bytes, report
        for s, pss in zip(servers, after, strict=True):  # the engine process, and so its pool, was counted
            assert len(descendants(s.proc.pid)) >= 2, report
            assert pss > s.metric(KV_BLOCKS_TOTAL) * BLOCK_SIZE * KV_BYTES_PER_TOKEN, report
        for s in servers:
            assert chat(s).strip()  # still serving
