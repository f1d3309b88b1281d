"""Tool calling over HTTP through the openai SDK: on SmolLM2 (whose template takes no tools: the fallback
prompt and Hermes blocks), required and named calls always validate, streamed calls reassemble to the
non-streamed ones, a tool result reaches the prompt, `none` answers in text, and bad tool requests get 400s
naming the problem; on tiny models whose templates take tools, the template renders them and its format is
parsed (docs/serving.md, "Tool calling")."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from flotilla_server.bench.tool_validity import TOOLS as BENCH_TOOLS
from flotilla_server.bench.tool_validity import calls_of

from tests.server.http.server_process import ServerProcess, run_server
from tests.server.structured.tool_templates import HERMES_TEMPLATE, LLAMA3_TEMPLATE, with_template
from tests.support.hf_models import make_hf_model_dir

NAME = "smollm2-135m-instruct"
WEATHER, CONVERT = BENCH_TOOLS[:2]  # the functions make bench calls (get_weather, convert_currency)
TOOLS = [WEATHER, CONVERT]
SET_MODE = {"type": "function", "function": {"name": "set_mode", "parameters": {
    "type": "object", "properties": {"mode": {"enum": ["eco", "fast"]}}, "required": ["mode"],
    "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Lisbon, and what are 20 dollars in euros?"}]


@pytest.fixture(scope="module")
def server(smollm2_server: ServerProcess) -> ServerProcess:
    return smollm2_server


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_required_and_named_calls_always_validate_streamed_and_not(client) -> None:
    def one(i: int) -> str:
        choice = "required" if i % 2 else {"type": "function", "function": {"name": "convert_currency"}}
        parallel, stream = i == 3, i >= 3
        reply = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice=choice,
                                               temperature=0.9, seed=i, max_tokens=48 if parallel else 96, stream=stream,
                                               parallel_tool_calls=parallel)
        calls, finish = calls_of(reply, stream)
        assert calls and finish in ("tool_calls", "length"), (calls, finish)
        if not parallel and finish == "tool_calls":
            assert len(calls) == 1  # one call, then only EOS may follow
        calls_of_cut = calls[-1]  # for the report
        if finish == "length":  # cut by max_tokens (a small model can write a number's digits on and on)
            calls = calls[:-1]
        for call in calls:
            if not isinstance(choice, str):
                assert call["name"] == "convert_currency"
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
            assert call["id"].startswith("call_")
        return finish if parallel or finish == "tool_calls" else f"{finish}: {calls_of_cut}"

    first = one(0)  # its prompt's blocks are then cached: the other five, the same prompt, prefill only their ends
    with ThreadPoolExecutor(5) as pool:  # make bench checks 100 (bench/tool_validity.py)
        finishes = [first, *pool.map(one, range(1, 6))]  # re-raises the first failure
    # one call each (parallel_tool_calls false): then only EOS may follow; with parallel calls a 135M model may
    # call on until max_tokens, the last call then cut
    assert all(f == "tool_calls" for i, f in enumerate(finishes) if i != 3), finishes


def test_a_streamed_call_reassembles_to_the_non_streamed_one(client) -> None:
    ask = {"model": NAME, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
           "max_tokens": 160, "parallel_tool_calls": False}
    whole, whole_finish = calls_of(client.chat.completions.create(**ask), stream=False)
    pieces = list(client.chat.completions.create(**ask, stream=True))
    streamed, finish = calls_of(iter(pieces), stream=True)
    assert finish == whole_finish
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["name"], c["arguments"]) for c in whole]
    argument_chunks = [d for p in pieces for c in p.choices for d in c.delta.tool_calls or () if d.function.arguments]
    assert len(argument_chunks) > 1  # the arguments come in pieces as they are generated


def test_a_tool_result_reaches_the_prompt_and_none_answers_in_text(client, server) -> None:
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Lisbon", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Lisbon: 23 degrees, clear sky"}]
    reply = client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, max_tokens=40, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    rendered = [line for line in server.log().splitlines() if reply.id in line and "rendered prompt" in line]
    assert rendered and "Lisbon: 23 degrees, clear sky" in rendered[0] and "<tool_call>" in rendered[0]
    none = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=30,
                                          temperature=0)
    assert not none.choices[0].message.tool_calls and none.choices[0].message.content
    assert none.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", ["nope", "not in tools"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters", ["type object"]),
    ({"tools": [WEATHER, WEATHER]}, "tools", ["more than once"]),
    ({"tools": TOOLS, "messages": [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
     "messages.1.tool_call_id", ["call_9", "matches no call"]),
    ({"tool_choice": "required"}, "tool_choice", ["needs tools"]),
    ({"functions": [{"name": "f"}]}, "functions", ["send tools"]),
    ({"tools": TOOLS, "tool_choice": "required", "stop": ["}"]}, "stop", ["stop"]),
    ({"tools": TOOLS, "logprobs": True}, "logprobs", ["logprobs"]),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}], "tool_choice": "required"},
     "tools", ["uniqueItems"]),
], ids=["unknown named function", "parameters not an object", "duplicate names", "unmatched tool_call_id",
        "required without tools", "legacy functions", "stop with required", "logprobs with tools",
        "an unenforceable keyword"])
def test_bad_tool_requests_get_400s_naming_the_problem(server, body, param, words) -> None:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                   json={"model": NAME, "messages": ASK, "max_tokens": 8, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    for w in words:
        assert w in error["message"], error


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> Path:
    return make_hf_model_dir("qwen2", tmp_path_factory.mktemp("qwen2") / "m")


@pytest.mark.parametrize(("template", "shape"), [(HERMES_TEMPLATE, "<tool_call>"), (LLAMA3_TEMPLATE, '"parameters"')],
                         ids=["hermes", "llama3_json"])
def test_a_template_that_takes_tools_renders_them_and_its_format_is_parsed(tmp_path, qwen2_dir, template,
                                                                          shape) -> None:
    model = with_template(Path(shutil.copytree(qwen2_dir, tmp_path / "m")), template)
    with run_server("--log-level", "debug", tmp_path=tmp_path, model_args=("--model", str(model))) as s:
        served = httpx.get(f"{s.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
        for stream in (False, True):
            # named: set_mode's arguments are one enum, so even tiny's random weights end the call within max_tokens
            reply = client.chat.completions.create(model=served, messages=ASK, tools=[WEATHER, SET_MODE],
                                                   max_tokens=100, stream=stream, parallel_tool_calls=False,
                                                   tool_choice={"type": "function", "function": {"name": "set_mode"}})
            calls, finish = calls_of(reply, stream)
            assert finish == "tool_calls" and len(calls) == 1  # tiny's random weights, held to the grammar
            assert calls[0]["name"] == "set_mode"
            jsonschema.validate(json.loads(calls[0]["arguments"]), SET_MODE["function"]["parameters"])
        prompts = [line for line in s.log().splitlines() if "rendered prompt" in line]
        assert "get_weather" in prompts[-1] and shape in prompts[-1]  # every tool is rendered
        assert "You may call functions to answer" not in prompts[-1]  # the template's own words, no fallback
