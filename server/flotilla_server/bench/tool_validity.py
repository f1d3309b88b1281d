"""Tool calls through the openai SDK, checked as an agent framework would: with `tool_choice` "required" or a
named function, every reply holds calls whose arguments parse and validate against the function's schema,
streamed or not. `flotilla-bench structured` runs 100 of these (half streamed) beside its other figures.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
            "source": {"enum": ["USD", "EUR", "GBP"]}, "target": {"enum": ["USD", "EUR", "GBP"]}},
            "required": ["amount", "source", "target"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "create_ticket", "description": "Open a support ticket.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 60}, "priority": {"enum": ["low", "normal", "high"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}},
            "required": ["title", "priority"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = ("What is the weather in Lisbon?", "How much is 250 pounds in dollars?",
             "My laptop will not start; please open a ticket.", "Is it raining in Oslo, and what are 20 euros in yen?")


def calls_of(reply: Any, stream: bool) -> tuple[list[dict[str, str]], str | None]:
    """(calls as {id, name, arguments}, finish_reason) of the SDK's whole reply, or of its stream's chunks joined
    as a client joins them."""
    if not stream:
        choice = reply.choices[0]
        return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in choice.message.tool_calls or ()], choice.finish_reason
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in reply:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or ():
                call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += d.id or ""
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
    return [calls[i] for i in sorted(calls)], finish


def one(client: Any, model: str, i: int) -> dict[str, Any]:
    named = i % 2 == 1
    choice: Any = {"type": "function", "function": {"name": TOOLS[i % 3]["function"]["name"]}} if named else "required"
    stream = i % 4 >= 2
    parallel = i % 5 == 4  # one request in five allows several calls
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTIONS[i % 4]}],
                                           tools=TOOLS, tool_choice=choice, max_tokens=256, temperature=0.8,
                                           seed=i, stream=stream, parallel_tool_calls=parallel)
    calls, finish = calls_of(reply, stream)
    problems = []
    if not calls:
        problems.append("no call")
    if not parallel and (finish != "tool_calls" or len(calls) != 1):
        problems.append(f"one call and finish_reason tool_calls expected, got {len(calls)} and {finish}")
    complete = calls[:-1] if finish == "length" else calls  # the last one cut
    for call in complete:
        if named and call["name"] != choice["function"]["name"]:
            problems.append(f"called {call['name']}, not {choice['function']['name']}")
        try:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        except (ValueError, KeyError, jsonschema.ValidationError) as e:
            problems.append(f"{call['name']}: {str(e)[:200]}")
    return {"named": named, "stream": stream, "parallel": parallel, "finish_reason": finish, "calls": len(calls),
            "problems": problems}


def run(base_url: str, model: str, requests: int = 100, concurrency: int = 16) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: one(client, model, i), range(requests)))
    return {"requests": requests, "streamed": sum(r["stream"] for r in results),
            "named": sum(r["named"] for r in results), "parallel": sum(r["parallel"] for r in results),
            "valid": sum(not r["problems"] for r in results),
            "finish_reasons": {f: sum(r["finish_reason"] == f for r in results)
                               for f in sorted({str(r["finish_reason"]) for r in results})},
            "calls": sum(r["calls"] for r in results),
            "problems": [r for r in results if r["problems"]]}
