"""Prefix caching seen from outside: the hit counters on /metrics, `cache_salt` isolation, an idle pool, the
prefix keys in the load report."""

from __future__ import annotations

import time
import uuid

import httpx
from flotilla_contract.load import LOAD_PATH, PREFIX_KEY_HEADER, ServerLoad


def complete(server, prompt: str, headers: dict[str, str] | None = None, **extra) -> None:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    r = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text


def hits(server) -> tuple[float, float]:
    return server.metric("flotilla_prefix_cache_hits_total"), server.metric("vllm:prefix_cache_hits_total")


def test_same_prompt_under_two_salts_gets_no_hits_and_the_same_salt_does(server) -> None:
    prompt = f"{uuid.uuid4()} " + "the same long system prompt, repeated to fill several blocks. " * 6
    complete(server, prompt, cache_salt="tenant-a")
    before = hits(server)
    complete(server, prompt, cache_salt="tenant-b")
    assert hits(server) == before, "a request under another salt hit the first tenant's blocks"
    complete(server, prompt)  # no salt is a tenant of its own too
    assert hits(server) == before
    complete(server, prompt, cache_salt="tenant-a")
    after = hits(server)
    assert after[0] - before[0] >= 16 and after[0] - before[0] == after[1] - before[1]
    assert server.metric("flotilla_prefix_cache_queries_total") >= after[0]


def test_cached_blocks_count_as_free_so_an_idle_server_uses_no_blocks(server) -> None:
    complete(server, f"{uuid.uuid4()} " + "a prompt that leaves cached blocks behind. " * 6)
    deadline = time.monotonic() + 10
    while server.metric("flotilla_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("flotilla_kv_blocks_used") == 0
    assert server.metric("flotilla_kv_blocks_cached") > 0


def test_the_load_report_lists_the_prefix_keys_whose_prompts_are_cached(server) -> None:
    key = uuid.uuid4().hex
    complete(server, f"{key} " + "a tenant's system prompt, long enough for several blocks. " * 6,
             headers={PREFIX_KEY_HEADER: key})
    deadline = time.monotonic() + 10
    while key not in (listed := ServerLoad.model_validate_json(httpx.get(f"{server.base_url}{LOAD_PATH}").content)
                      .prefix_keys):
        assert time.monotonic() < deadline, f"{key} never listed: {listed}"
        time.sleep(0.05)
    assert listed[0] == key  # the most recent first
    bad = httpx.post(f"{server.base_url}/v1/completions", headers={PREFIX_KEY_HEADER: "no spaces, please"},
                     json={"model": "tiny", "prompt": "Hi", "max_tokens": 1}, timeout=60)
    assert bad.status_code == 400 and PREFIX_KEY_HEADER in bad.json()["error"]["message"]
