"""The field policy (docs/serving.md, "Field policy"): every field of the pinned openai SDK's request types is
classified; accepted fields are answered with 200, refused ones with a 400 that names them."""

from __future__ import annotations

import typing

import httpx
import openai
import pytest
from flotilla_server.http import field_policy as fp
from flotilla_server.http.schemas import ChatCompletionRequest, CompletionRequest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

SDK_TYPES = {
    "completions": [completion_create_params.CompletionCreateParamsNonStreaming,
                    completion_create_params.CompletionCreateParamsStreaming],
    "chat": [chat_create_params.CompletionCreateParamsNonStreaming,
             chat_create_params.CompletionCreateParamsStreaming],
}
SCHEMAS = {"completions": CompletionRequest, "chat": ChatCompletionRequest}
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def classified(endpoint: str) -> set[str]:
    return set(fp.SUPPORTED[endpoint]) | set(fp.IGNORED[endpoint]) | set(fp.REFUSED[endpoint])


@pytest.mark.parametrize("endpoint", sorted(SDK_TYPES))
def test_every_field_of_the_sdk_request_types_is_classified_exactly_once(endpoint) -> None:
    sdk_fields = set().union(*(typing.get_type_hints(t) for t in SDK_TYPES[endpoint]))
    unclassified = sdk_fields - classified(endpoint)
    assert not unclassified, f"openai {openai.__version__} sends {sorted(unclassified)}: classify them in field_policy"
    assert not classified(endpoint) - sdk_fields, "the policy names a field the SDK does not have"
    groups = [fp.SUPPORTED[endpoint], fp.IGNORED[endpoint], set(fp.REFUSED[endpoint]), fp.OURS,
              fp.OURS_BY_ENDPOINT[endpoint]]
    assert sum(len(g) for g in groups) == len(set().union(*groups)), "a field has two treatments"
    # the schema declares exactly the supported fields and ours
    assert set(SCHEMAS[endpoint].model_fields) == set(fp.SUPPORTED[endpoint]) | fp.OURS | fp.OURS_BY_ENDPOINT[endpoint]


# a realistic value for each ignored field, and the neutral value clients send for each refused one
IGNORED_VALUES = {
    "metadata": {"k": "v"}, "store": False, "service_tier": "auto", "safety_identifier": "abc",
    "prediction": {"type": "content", "content": "x"}, "prompt_cache_key": "k",
    "prompt_cache_retention": "in-memory", "prompt_cache_options": None,
}
NEUTRAL = {
    "logit_bias": {}, "best_of": 1, "suffix": None, "functions": [],
    "function_call": "none", "audio": None, "modalities": ["text"],
    "reasoning_effort": None, "verbosity": "medium", "web_search_options": None, "moderation": None,
}
REFUSING = {
    "logit_bias": {"5": 10}, "best_of": 3, "suffix": "end",
    "functions": [{"name": "f"}], "function_call": {"name": "f"},
    "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"], "reasoning_effort": "high",
    "verbosity": "low", "web_search_options": {}, "moderation": {"x": 1},
}


def base(endpoint: str) -> dict:
    body = {"model": "tiny", "max_tokens": 3, "temperature": 0, "top_p": 1, "seed": 1, "stop": ["\n\n\n"],
            "user": "u1", "top_k": -1, "ignore_eos": True, "cache_salt": "s", "frequency_penalty": 0.1,
            "presence_penalty": 0.1, "repetition_penalty": 1.1, "min_p": 0.05, "n": 2}
    if endpoint == "chat":
        return {**body, "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}
    return {**body, "prompt": ["hi", "ho"], "logprobs": 2, "echo": False}


@pytest.mark.parametrize("endpoint", sorted(SDK_TYPES))
def test_a_request_carrying_every_accepted_field_is_answered(server, endpoint) -> None:
    body = base(endpoint)
    body |= {k: IGNORED_VALUES[k] for k in fp.IGNORED[endpoint]}
    body |= {k: NEUTRAL[k] for k in fp.REFUSED[endpoint]}
    r = httpx.post(server.base_url + PATHS[endpoint], json=body, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(server.base_url + PATHS[endpoint], timeout=60,
                   json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text


@pytest.mark.parametrize(("endpoint", "field"),
                         [(e, f) for e in sorted(SDK_TYPES) for f in sorted(fp.REFUSED[e])])
def test_each_refused_feature_gets_a_400_naming_it(server, endpoint, field) -> None:
    r = httpx.post(server.base_url + PATHS[endpoint], json={**base(endpoint), field: REFUSING[field]}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"] and "not supported" in error["message"]


def test_an_unknown_field_gets_a_400_naming_it(server) -> None:
    r = httpx.post(server.base_url + "/v1/completions", json={**base("completions"), "temprature": 0.5}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temprature"
    assert "unknown field 'temprature'" in r.json()["error"]["message"]


def test_chat_max_tokens_defaults_to_the_context_left(server) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a long story " * 25}],
            "temperature": 0, "ignore_eos": True}
    url = server.base_url + "/v1/chat/completions"
    num_prompt_tokens = httpx.post(url, json={**body, "max_tokens": 1}, timeout=60).json()["usage"]["prompt_tokens"]
    assert 16 < 512 - num_prompt_tokens < 300  # the server runs with --max-model-len 512
    r = httpx.post(url, json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 512 - num_prompt_tokens  # OpenAI sets no default; ours was 16


def test_a_message_name_is_refused_where_the_template_cannot_use_it(server) -> None:
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi", "name": "ann"}]}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.name", r.text
    assert "messages[].name is not supported" in r.json()["error"]["message"]


def test_templates_that_read_a_message_name_are_recognised() -> None:
    from flotilla_server.http.routes.chat import template_reads_name
    from flotilla_server.model.tiny import CHAT_TEMPLATE

    assert not template_reads_name(CHAT_TEMPLATE) and not template_reads_name(None)
    assert template_reads_name("{% for message in messages %}{{ message['name'] }}{% endfor %}")
    assert template_reads_name("{% for message in messages %}{{ message.name }}{% endfor %}")
    assert not template_reads_name("{% for tool in tools %}{{ tool.name }}{% endfor %}")
