"""Real clients over real TCP: the openai SDK on both endpoints, incremental delivery, 64 concurrent streams."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import time
from urllib.parse import urlparse

import openai
import pytest

from tests.server.http import raw_http

PROMPT = "the ships sail north to the harbour"


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(server):
    models = _client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert "DEMONSTRATION" in models.data[0].model_extra["description"]  # tiny says what it is wherever it appears


def test_sdk_completions_stream_equals_non_stream(server):
    client = _client(server)
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text
    # include_usage as OpenAI sends it: usage null on every choice chunk, then one chunk of usage and no choices
    last, finish = chunks[-1], chunks[-2]
    assert last.choices == [] and all(c.usage is None for c in chunks[:-1])
    assert finish.choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    assert last.usage.completion_tokens == whole.usage.completion_tokens == 24
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2])


def test_sdk_chat_stream_equals_non_stream(server):
    client = _client(server)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0, seed=3)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0,
                                                 seed=3, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)  # not asked for: no usage, as OpenAI
    assert whole.usage.total_tokens > 0


def test_stop_string_ends_generation_before_it(server):
    client = _client(server)
    kw = {"model": "tiny", "prompt": PROMPT, "max_tokens": 40, "temperature": 1.0, "seed": 11}
    free = client.completions.create(**kw).choices[0].text
    k = next(k for k in range(4, len(free) - 2) if free.find(free[k : k + 2]) == k)  # first new 2-char piece
    stop = free[k : k + 2]
    cut = client.completions.create(**kw, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == free[:k]


def test_chunks_arrive_incrementally(server):
    """For a 64-token generation, chunk arrivals span at least half the generation time."""
    url = urlparse(server.base_url)

    async def go():
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 64, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        reader, writer = await raw_http.connect(url.hostname, url.port)
        writer.write(raw_http.request_bytes(url.hostname, url.port, "/v1/completions", body))
        sent = time.monotonic()
        resp = await raw_http.read_rest(reader, await raw_http.read_head(reader, sent))
        writer.close()
        return sent, resp

    sent, resp = asyncio.run(go())
    assert resp.status == 200 and resp.done
    assert resp.events[-1]["usage"]["completion_tokens"] == 64
    times = resp.event_times_s
    generation_s = times[-1] - sent
    span_s = times[-1] - times[0]
    assert len(times) >= 32, f"64 tokens came in only {len(times)} chunks"
    assert span_s >= 0.5 * generation_s, f"chunks span {span_s:.3f} s of a {generation_s:.3f} s generation"


def test_64_concurrent_streams_complete(server):
    url = urlparse(server.base_url)

    async def one(i: int):
        body = {"model": "tiny", "prompt": f"{PROMPT} {i}", "max_tokens": 32 + i % 16, "ignore_eos": True,
                "stream": True, "temperature": 0.7, "seed": i, "stream_options": {"include_usage": True}}
        return await raw_http.post(url.hostname, url.port, "/v1/completions", body)

    async def go():
        return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(go())
    for i, r in enumerate(results):
        assert r.status == 200, r.body
        assert r.done, f"stream {i} ended without [DONE]"
        final, usage = r.events[-2], r.events[-1]
        assert final["choices"][0]["finish_reason"] == "length"
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 32 + i % 16
        assert not any("error" in e for e in r.events)
    assert server.metric("flotilla_kv_blocks_used") == 0


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes(server, path):
    import httpx

    assert httpx.get(server.base_url + path).json()["status"] in ("ok", "ready")


def test_startup_prints_a_curl_example_that_works(server):
    line = next(x for x in server.log().splitlines() if x.strip().startswith("curl -N"))
    argv = shlex.split(line.strip())
    assert server.base_url in line
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    # "stop" too: tiny's random weights may produce EOS, depending on what shares the request's steps
    assert out.rstrip().endswith("data: [DONE]") and re.search(r'"finish_reason":"(length|stop)"', out)
