"""Structured output over HTTP on SmolLM2-135M-Instruct (its 49,152-token vocabulary): valid JSON under load,
the SDK's `.parse`, the completions endpoint, what stop / logprobs / ignore_eos / n / max_tokens do with a
schema, bad schemas refused naming the problem, and the metrics (docs/serving.md, "Structured output")."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pydantic
import pytest
from flotilla_server.bench.structured_validity import run, summary
from flotilla_server.bench.structured_workload import CASES, plan, request_body

from tests.server.http.server_process import ServerProcess

NAME = "smollm2-135m-instruct"
PERSON = CASES[0]  # person_extraction


@pytest.fixture(scope="module")
def server(smollm2_server: ServerProcess) -> ServerProcess:
    return smollm2_server


def chat(server: ServerProcess, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": NAME, **body}, timeout=120)


def person(server: ServerProcess, **extra) -> httpx.Response:
    return chat(server, **{**request_body(PERSON, PERSON.prompts[0], NAME, 256, 0.0), **extra})


def test_constrained_requests_mixed_with_free_ones_all_parse_and_validate(server) -> None:
    # 6 schemas of real API shapes, 4 requests each (the 200 of make bench add a seventh, longer one, at
    # concurrency 16); 8 streamed, so every schema streams once; 6 unconstrained requests mixed in; all 30 at once
    cases = [c for c in CASES if c.name != "calendar_event"]
    outcomes = run(server.base_url, plan(24, 8, 6, NAME, max_tokens=512, cases=cases, free_max_tokens=16),
                   concurrency=30)
    s = summary(outcomes)
    assert s["statuses"] == {200: 30}, s
    assert not s["stopped_invalid"], s["stopped_invalid"]
    assert set(s["finish_reasons"]) <= {"stop", "length"} and s["stop_share"] >= 0.9, s
    assert s["streamed"] == 8 and len(s["by_case"]) == 6
    free = [o for o in outcomes if o.case is None]
    assert all(o.finish_reason in ("stop", "length") and o.content for o in free)


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def test_the_sdk_parse_returns_a_parsed_object(server) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    reply = client.chat.completions.parse(model=NAME, response_format=City, max_tokens=200, temperature=0,
                                          messages=[{"role": "user", "content": "Name a big city."}])
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(reply.choices[0].message.parsed, City)


def test_json_object_and_the_completions_endpoint(server) -> None:
    r = chat(server, max_tokens=40, temperature=0, response_format={"type": "json_object"},
             messages=[{"role": "user", "content": "Describe a dog in JSON with two fields."}])
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    schema = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 2, "maxItems": 3}
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "model": NAME, "prompt": "Three colours as a JSON list:", "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "colours", "schema": schema}}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["text"]), schema)


def test_n_choices_each_follow_the_schema_and_ignore_eos_still_ends_at_the_schema(server) -> None:
    r = person(server, n=3, temperature=1.0, seed=7, ignore_eos=True)
    choices = r.json()["choices"]
    assert len(choices) == 3
    for c in choices:  # ignore_eos: the grammar's end still ends the reply
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c["message"]["content"]), PERSON.schema)
    assert len({c["message"]["content"] for c in choices}) > 1  # each its own matcher, its own sample


def test_a_reply_cut_by_max_tokens_ends_length_with_incomplete_json(server) -> None:
    choice = person(server, max_tokens=5).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])


def test_logprobs_with_a_schema_are_the_models_own_one_per_token(server) -> None:
    body = person(server, logprobs=True, top_logprobs=3).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    assert "".join(t["token"] for t in content) == body["choices"][0]["message"]["content"]
    assert all(len(t["top_logprobs"]) == 3 and t["logprob"] <= 0 for t in content)


def test_stop_with_a_schema_and_bad_schemas_get_400s_naming_the_problem(server) -> None:
    def refused(response_format: dict, **extra) -> dict:
        r = chat(server, max_tokens=8, messages=[{"role": "user", "content": "x"}], response_format=response_format,
                 **extra)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    def fmt(schema: dict | None) -> dict:
        spec = {"name": "s"} if schema is None else {"name": "s", "schema": schema}
        return {"type": "json_schema", "json_schema": spec}

    e = refused(fmt({"type": "objekt"}))
    assert e["param"] == "response_format.json_schema.schema" and "not a valid JSON Schema" in e["message"]
    e = refused(fmt({"type": "array", "uniqueItems": True}))
    assert "uniqueItems" in e["message"] and e["param"] == "response_format"
    e = refused(fmt(None))
    assert e["param"] == "response_format.json_schema.schema" and "required" in e["message"]
    e = refused(fmt({"$schema": "https://example.com/my-draft", "type": "object"}))
    assert "$schema" in e["message"]
    e = refused({"type": "json_object"}, stop=["}"])
    assert e["param"] == "stop"
    assert person(server).status_code == 200  # still serving


def test_metrics_count_constrained_requests_compiles_cache_hits_and_mask_fills(server) -> None:
    for _ in range(2):  # the second finds the first's compile (a hit); 12 tokens, 12 masked steps each
        assert person(server, max_tokens=12).status_code == 200
    assert server.metric("flotilla_constrained_requests_total", kind="json_schema") >= 2
    assert server.metric("flotilla_grammar_cache_lookups_total", result="hit") >= 1
    assert server.metric("flotilla_grammar_compile_seconds_count", outcome="compiled") >= 1
    assert server.metric("flotilla_grammar_mask_seconds_count") >= 10
    assert "Traceback" not in server.log()
