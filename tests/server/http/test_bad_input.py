"""Malformed requests: each gets its 4xx and an OpenAI-style message saying what to change; the server keeps serving."""

from __future__ import annotations

import asyncio
from urllib.parse import urlparse

import httpx
import pytest

from tests.server.http import raw_http

C = "/v1/completions"
CHAT = "/v1/chat/completions"
OK = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
OK_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

# (name, method, path, body: dict | bytes, status, words the message must contain)
CASES = [
    ("invalid JSON", "POST", C, b'{"model": "tiny", "prompt": ', 400, ["not valid JSON"]),
    ("JSON array body", "POST", C, b"[1, 2]", 400, ["JSON object"]),
    ("empty body", "POST", C, b"", 400, ["empty"]),
    ("invalid UTF-8", "POST", C, b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, ["UTF-8"]),
    ("max_tokens wrong type", "POST", C, {**OK, "max_tokens": "many"}, 400, ["max_tokens", "integer"]),
    ("negative max_tokens", "POST", C, {**OK, "max_tokens": -5}, 400, ["max_tokens", "greater than or equal to 1"]),
    ("temperature out of range", "POST", C, {**OK, "temperature": 7}, 400, ["temperature", "less than or equal to 2"]),
    ("top_p zero", "POST", C, {**OK, "top_p": 0}, 400, ["top_p", "greater than 0"]),
    ("top_k below -1", "POST", C, {**OK, "top_k": -3}, 400, ["top_k"]),
    ("prompt over the context", "POST", C, {**OK, "prompt": "word " * 600}, 400, ["never fit", "shorten"]),
    ("max_tokens over the context", "POST", C, {**OK, "max_tokens": 5000}, 400, ["never fit", "max_tokens"]),
    ("missing prompt", "POST", C, {"model": "tiny"}, 400, ["prompt", "Field required"]),
    ("empty messages", "POST", CHAT, {**OK_CHAT, "messages": []}, 400, ["messages", "at least 1"]),
    ("unknown role", "POST", CHAT, {**OK_CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400,
     ["role", "'user'"]),
    ("unknown model", "POST", C, {**OK, "model": "gpt-9"}, 404, ["gpt-9", "GET /v1/models"]),
    ("n zero", "POST", C, {**OK, "n": 0}, 400, ["n", "greater than or equal to 1"]),
    ("n over the slots", "POST", C, {**OK, "n": 65}, 400, ["n is 65", "set n to 64 or less"]),
    ("unknown field", "POST", C, {**OK, "logprobz": 5}, 400, ["logprobz", "unknown field"]),
    ("an empty prompt in a list", "POST", C, {**OK, "prompt": ["a", ""]}, 400, ["prompt"]),
    ("one prompt of a list over the context", "POST", C, {**OK, "prompt": ["a", "word " * 600]}, 400,
     ["never fit", "shorten"]),
    ("too many stop strings", "POST", C, {**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, ["stop"]),
    ("stream_options without stream", "POST", C, {**OK, "stream_options": {"include_usage": True}}, 400,
     ["stream_options", "stream"]),
    ("token id outside vocabulary", "POST", C, {**OK, "prompt": [1, 2, 10**6]}, 400, ["vocabulary"]),
    ("oversized body", "POST", C, {**OK, "prompt": "x" * (5 * 1024 * 1024)}, 413, ["larger than", "shorten"]),
    ("wrong method", "GET", C, b"", 405, ["POST"]),
    ("unknown path", "POST", "/v1/embeddings", OK, 404, ["No route"]),
]


@pytest.mark.parametrize(("name", "method", "path", "body", "status", "words"), CASES, ids=[c[0] for c in CASES])
def test_malformed_request(server, name, method, path, body, status, words):
    url = urlparse(server.base_url)
    resp = asyncio.run(raw_http.post(url.hostname, url.port, path, body, method=method))
    assert resp.status == status, resp.body
    error = httpx.Response(200, content=resp.body).json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    for word in words:
        assert word.lower() in error["message"].lower(), error["message"]


def test_still_serving_after_the_bad_inputs(server):
    # ignore_eos: greedy text on tiny's random weights may meet EOS, depending on what shares its steps
    r = httpx.post(f"{server.base_url}/v1/completions", json={**OK, "ignore_eos": True}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert server.metric("flotilla_requests_total", code="500") == 0
    for code, at_least in {"400": 19, "404": 2, "405": 1, "413": 1}.items():  # every refusal is counted
        assert server.metric("flotilla_requests_total", code=code) >= at_least, code
    assert "Traceback" not in server.log()


def test_a_body_sent_as_a_form_is_told_to_send_json(server):
    # what `curl -d` sends without -H 'Content-Type: application/json'
    r = httpx.post(f"{server.base_url}/v1/completions", content=b'{"model": "tiny", "prompt": "x"}',
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=30)
    assert r.status_code == 400
    assert "Content-Type: application/json" in r.json()["error"]["message"]


def test_the_context_message_says_its_advice_once_and_only_about_fields_sent(server):
    sent = httpx.post(f"{server.base_url}/v1/completions", json={**OK, "prompt": "word " * 600}, timeout=30)
    message = sent.json()["error"]["message"]
    assert message.lower().count("shorten the prompt") == 1, message
    unsent = httpx.post(f"{server.base_url}/v1/completions", json={"model": "tiny", "prompt": "word " * 3000},
                        timeout=30)
    assert unsent.status_code == 400
    error = unsent.json()["error"]
    assert "max_tokens" not in error["message"] and "shorten the prompt" in error["message"], error
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
