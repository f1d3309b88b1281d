"""A chat request's tools: checked (each problem a 400 naming it), rendered into the prompt, and, for
`tool_choice` "required" or a named function, made into the grammar every reply follows.

The tools reach the model through its chat template when the template takes `tools` (Hermes, Qwen, Llama 3.1+
templates do), with the history's calls and results as the template expects them; otherwise through
FALLBACK_PROMPT, a system prompt that asks for Hermes `<tool_call>` blocks, with earlier calls written the
same way and results sent as `<tool_response>` user turns. The reply is read by the parser the template
implies (tool_calls.py), or `--tool-call-parser`.

`tool_choice`: "none" renders no tools and reads no calls; "auto" (the default with tools) renders them and
reads calls the model makes; "required" or a named function constrains decoding to calls (grammar/
tool_grammar.py), so whatever the model, every call parses and its arguments validate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flotilla_server.grammar.json_schema import GrammarError, check_schema
from flotilla_server.grammar.tool_grammar import tool_call_grammar
from flotilla_server.http.errors import APIError
from flotilla_server.http.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice
from flotilla_server.http.structured import Constraint
from flotilla_server.http.tool_calls import HERMES, LLAMA3_JSON

TOOL_REQUIRED, TOOL_NAMED = "tool_required", "tool_named"  # what constrained a reply (metrics label `kind`)

FALLBACK_PROMPT = """You may call functions to answer. To call one, reply with a block
<tool_call>
{{"name": "<function name>", "arguments": <the arguments as a JSON object>}}
</tool_call>
for each call, and nothing else. A function's result comes back in a <tool_response> block.
The functions:
<tools>
{tools}
</tools>"""


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools are served."""

    parser: str  # HERMES or LLAMA3_JSON
    render: bool  # tools go into the prompt (not with tool_choice "none")
    parse: bool  # the reply is read for calls (not with "none")
    max_calls: int | None  # 1 with parallel_tool_calls false
    constraint: Constraint | None  # "required" or a named function


def template_takes_tools(template: str | None) -> bool:
    return template is not None and re.search(r"\btools\b", template) is not None


def parser_for(template: str | None, flag: str) -> str:
    """--tool-call-parser, or what the template writes: <|python_tag|> or "parameters" JSON is Llama 3's."""
    if flag != "auto":
        return flag
    if template_takes_tools(template) and "<tool_call>" not in template and (
            "<|python_tag|>" in template or '"parameters"' in template):
        return LLAMA3_JSON
    return HERMES


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param)


def plan_tools(body: ChatCompletionRequest, template: str | None, parser_flag: str) -> ToolPlan | None:
    """None without tools; else the plan, after every check of `tools`, `tool_choice` and the history."""
    check_history(body.messages)
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice needs tools: send the functions in tools, or drop tool_choice.", "tool_choice")
        return None
    names = [t.function.name for t in body.tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _bad(f"tools names {', '.join(dupes)} more than once: give each function one entry.", "tools")
    functions = []
    for i, tool in enumerate(body.tools):
        params = tool.function.parameters
        param = f"tools.{i}.function.parameters"
        if params is not None:
            if params.get("type", "object") != "object":
                raise _bad(f"{param} must be a JSON Schema of type object (a function takes named arguments), got "
                           f"type {params.get('type')!r}.", param)
            try:
                check_schema(params, param)
            except GrammarError as e:
                raise _bad(f"{e}.", param) from None
        functions.append((tool.function.name, params))
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise _bad(f"tool_choice names {choice.function.name!r}, which is not in tools ({', '.join(names)}).",
                   "tool_choice.function.name")
    if choice == "none":
        return ToolPlan(HERMES, render=False, parse=False, max_calls=None, constraint=None)
    parser = parser_for(template, parser_flag)
    parallel = body.parallel_tool_calls is not False
    constraint = None
    if choice == "required" or isinstance(choice, NamedToolChoice):
        chosen = functions if choice == "required" else [f for f in functions if f[0] == choice.function.name]
        kind = TOOL_REQUIRED if choice == "required" else TOOL_NAMED
        constraint = Constraint(tool_call_grammar(chosen, parser, parallel), kind)
    return ToolPlan(parser, render=True, parse=True, max_calls=None if parallel else 1, constraint=constraint)


def check_history(messages: list[ChatMessage]) -> None:
    """Every tool message answers a call an earlier assistant message made; every call's arguments are JSON."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        for j, call in enumerate(m.tool_calls or ()):
            try:
                json.loads(call.function.arguments)
            except ValueError:
                raise _bad(f"messages.{i}.tool_calls.{j}.function.arguments is not JSON text: send the arguments "
                           "as the model wrote them.", f"messages.{i}.tool_calls.{j}.function.arguments") from None
            calls.add(call.id)
        if m.role == "tool" and m.tool_call_id not in calls:
            raise _bad(f"messages.{i}.tool_call_id {m.tool_call_id!r} matches no call of an earlier assistant "
                       "message: answer a call the conversation holds.", f"messages.{i}.tool_call_id")


def _function_names(messages: list[ChatMessage]) -> dict[str, str]:
    return {c.id: c.function.name for m in messages for c in (m.tool_calls or ())}


def template_messages(body: ChatCompletionRequest, plan: ToolPlan | None, template: str | None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and extra template variables (`tools`) to render: through the template's own tool
    support, or the fallback prompt."""
    names = _function_names(body.messages)
    native = plan is not None and plan.render and template_takes_tools(template)
    out: list[dict[str, Any]] = []
    for m in body.messages:
        role = m.role if m.role != "developer" else "system"
        d: dict[str, Any] = {"role": role, "content": m.text()}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_calls:
            if native:
                d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": json.loads(c.function.arguments)}} for c in m.tool_calls]
            else:
                d["content"] = (d["content"] + "\n" if d["content"] else "") + "\n".join(
                    f'<tool_call>\n{{"name": {json.dumps(c.function.name)}, "arguments": {c.function.arguments}}}\n'
                    "</tool_call>" for c in m.tool_calls)
        if m.role == "tool":
            if native:
                d.update(tool_call_id=m.tool_call_id, name=names[m.tool_call_id or ""])
            else:
                d = {"role": "user", "content": f"<tool_response>\n{m.text()}\n</tool_response>"}
        out.append(d)
    extra: dict[str, Any] = {}
    if plan is not None and plan.render:
        tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
        if native:
            extra["tools"] = tools
        else:
            prompt = FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t["function"], ensure_ascii=False)
                                                             for t in tools))
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
            else:
                out.insert(0, {"role": "system", "content": prompt})
    return out, extra
