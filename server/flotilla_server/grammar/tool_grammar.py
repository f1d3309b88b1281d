"""The grammar of a reply that must call a tool (`tool_choice` "required" or a named function): one call, or
several with `parallel_tool_calls`, each of a given function with arguments valid under its `parameters`,
in the format the reply is parsed in (http/tool_calls.py). Whatever the model, its calls then parse and
their arguments validate.
"""

from __future__ import annotations

from typing import Any

import llguidance

from flotilla_server.grammar.json_schema import JSON_OPTIONS, schema_text

HERMES, LLAMA3_JSON = "hermes", "llama3_json"
ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}


def call_schema(functions: list[tuple[str, dict[str, Any] | None]], arguments_key: str) -> dict[str, Any]:
    """One call object of any of `functions` (name, parameters schema): the name first, so that the parser
    streams the arguments as they come."""
    options = [{"type": "object", "properties": {"name": {"const": name}, arguments_key: params or ANY_ARGUMENTS},
                "required": ["name", arguments_key], "additionalProperties": False} for name, params in functions]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_grammar(functions: list[tuple[str, dict[str, Any] | None]], parser: str, parallel: bool) -> str:
    """The lark grammar (with llguidance's %json) of one call, or one or more calls when `parallel`."""
    key = "arguments" if parser == HERMES else "parameters"
    schema = {**call_schema(functions, key), "x-guidance": JSON_OPTIONS}
    if parser == HERMES:
        lark = 'start: call ("\\n" call)*\n' if parallel else "start: call\n"
        lark += 'call: "<tool_call>\\n" body "\\n</tool_call>"\n'
    else:
        lark = 'start: body ("; " body)*\n' if parallel else "start: body\n"
    lark += f"body: %json {schema_text(schema)}\n"
    return llguidance.LLMatcher.grammar_from_lark(lark)

