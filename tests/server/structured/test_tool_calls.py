"""The tool-call parsers (http/tool_calls.py), as pure functions: a reply cut into any chunks reads the same as
whole (so a stream reassembles to the non-streamed reply), text that may open a call is held back and no
longer, and what is not a call stays content."""

from __future__ import annotations

from flotilla_server.http.tool_calls import (
    HERMES,
    LLAMA3_JSON,
    CallArguments,
    CallStart,
    Content,
    ReplyReader,
    collect,
    new_parser,
    parse_whole,
)
from hypothesis import given, settings
from hypothesis import strategies as st

HERMES_REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lis{b}on \\"old\\"", '
                '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"xs": [1, [2]]}}\n'
                "</tool_call> done")
LLAMA3_REPLY = '{"name": "get_weather", "parameters": {"city": "Oslo \\"; {x}"}}; {"name": "add", "parameters": {}}'


def streamed(parser: str, text: str, cuts: list[int]) -> tuple:
    p = new_parser(parser)
    deltas, last = [], 0
    for cut in sorted(set(cuts)):
        deltas += p.feed(text[last:cut])
        last = cut
    deltas += p.feed(text[last:]) + p.finish()
    reply = collect(deltas)
    return reply.content, [(c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls]


def whole(parser: str, text: str) -> tuple:
    reply = parse_whole(parser, text)
    return reply.content, [(c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls]


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, len(HERMES_REPLY)), max_size=12))
def test_a_hermes_reply_in_any_chunks_reads_as_whole(cuts: list[int]) -> None:
    assert streamed(HERMES, HERMES_REPLY, cuts) == whole(HERMES, HERMES_REPLY) == (
        "Let me check.\n\n done",
        [("get_weather", '{"city": "Lis{b}on \\"old\\"", "unit": "celsius"}'), ("add", '{"xs": [1, [2]]}')])


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, len(LLAMA3_REPLY)), max_size=8))
def test_a_llama3_reply_in_any_chunks_reads_as_whole(cuts: list[int]) -> None:
    assert streamed(LLAMA3_JSON, LLAMA3_REPLY, cuts) == whole(LLAMA3_JSON, LLAMA3_REPLY) == (
        None, [("get_weather", '{"city": "Oslo \\"; {x}"}'), ("add", "{}")])  # a ; and braces inside a string


def test_text_that_may_open_a_call_is_held_back_until_it_cannot() -> None:
    p = new_parser(HERMES)
    assert p.feed("Hello <tool") == [Content("Hello ")]
    assert p.feed("box>") == [Content("<toolbox>")]  # not a call after all
    assert p.feed("<tool_call>") == []
    deltas = p.feed('{"name": "f", "arguments": {"a": 1')
    assert isinstance(deltas[0], CallStart) and deltas[0].name == "f" and deltas[1] == CallArguments(0, '{"a": 1')
    assert p.feed("}}") == [CallArguments(0, "}")]  # the arguments end where their object closes
    assert p.feed("\n</tool_call>") == [] and p.finish() == []


def test_what_is_not_a_call_stays_content() -> None:
    assert whole(HERMES, "<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert whole(HERMES, "Sure! <tool_c") == ("Sure! <tool_c", [])
    assert whole(LLAMA3_JSON, "{not json") == ("{not json", [])
    assert whole(LLAMA3_JSON, "The answer is {x}.") == ("The answer is {x}.", [])
    # a call left open when the reply ends counts if its JSON is complete (a model that omits the closing tag)
    assert whole(HERMES, '<tool_call>{"name": "f", "arguments": {}}') == (None, [("f", "{}")])


def test_parallel_tool_calls_false_keeps_the_first_call_and_names_the_finish() -> None:
    reader = ReplyReader(HERMES, max_calls=1)
    reader.feed(HERMES_REPLY)
    reader.finish()
    reply = collect(reader.deltas)
    assert [c["function"]["name"] for c in reply.tool_calls] == ["get_weather"]
    assert reader.finish_reason("stop") == "tool_calls" and reader.finish_reason("length") == "length"
    assert ReplyReader(HERMES).finish_reason("stop") == "stop"
