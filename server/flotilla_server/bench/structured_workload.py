"""Structured-output requests shaped like real APIs' schemas: the validity checks of `make test`
(tests/server/structured) and `make bench` (scripts/structured_validity.py) draw from these.

Each schema bounds its strings and arrays, as production schemas do (a name is not a novel), so a reply that
follows it ends; nested objects, arrays, enums, bounded numbers, optional fields, a pattern and `anyOf` all
appear. The prompts ask for what the schema describes, in plain words, as an extraction or agent app would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

Schema = dict[str, Any]


def _obj(properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    return {"type": "object", "properties": properties, "required": required if required is not None else list(properties),
            "additionalProperties": False}


def _str(max_length: int, **extra: Any) -> Schema:
    return {"type": "string", "maxLength": max_length, **extra}


@dataclass(frozen=True)
class Case:
    name: str
    schema: Schema
    prompts: tuple[str, ...]


CASES: tuple[Case, ...] = (
    Case("person_extraction", _obj({
        "name": _str(40), "age": {"type": "integer", "minimum": 0, "maximum": 120}, "occupation": _str(40),
    }), ("Extract the person: 'Maria Lopez is a 34-year-old architect from Madrid.'",
         "Extract the person: 'At 71, retired teacher John Smith still runs every morning.'",
         "Who is described here? 'Dr. Aiko Tanaka, 45, is a surgeon.'")),
    Case("weather_report", _obj({
        "city": _str(30), "temperature_c": {"type": "number", "minimum": -80, "maximum": 60},
        "conditions": {"enum": ["sunny", "cloudy", "rain", "snow", "storm", "fog"]},
        "humidity_pct": {"type": "integer", "minimum": 0, "maximum": 100},
    }), ("Report the weather in Paris today as data.", "What is the weather like in Oslo in winter? Answer as data.",
         "Give a weather report for Cairo.")),
    Case("order_line_items", _obj({
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": _obj({
            "sku": _str(12), "quantity": {"type": "integer", "minimum": 1, "maximum": 20},
            "unit_price": {"type": "number", "minimum": 0, "maximum": 1000},
        })},
        "currency": {"enum": ["USD", "EUR", "GBP", "JPY"]},
    }), ("Create an order for two notebooks and one pen.", "Record this purchase: 3 mugs at 8 euros each.",
         "Make an order with a keyboard and a mouse, paid in dollars.")),
    Case("issue_triage", _obj({
        "title": _str(60), "labels": {"type": "array", "maxItems": 3,
                                      "items": {"enum": ["bug", "feature", "docs", "performance", "security"]}},
        "priority": {"enum": ["low", "medium", "high", "urgent"]}, "assignee": _str(20),
    }, required=["title", "labels", "priority"]), (
        "Triage this report: 'The login page crashes when the password has an emoji.'",
        "Triage: 'Please add a dark mode to the settings page.'",
        "Triage: 'The README install steps are out of date.'")),
    Case("tool_result_anyof", _obj({
        "result": {"anyOf": [
            _obj({"status": {"const": "ok"}, "count": {"type": "integer", "minimum": 0, "maximum": 1000}}),
            _obj({"status": {"const": "error"}, "message": _str(60)}),
        ]},
    }), ("Search the catalogue for red shoes and report how many you found.",
         "The database is down. Report the search result.", "Count the open tickets and report the result.")),
    Case("calendar_event", _obj({
        "title": _str(50),
        "start": _obj({"date": {"type": "string", "pattern": "^2027-[01][0-9]-[0-3][0-9]$"},
                       "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}}),
        "attendees": {"type": "array", "maxItems": 3, "items": _obj({"name": _str(30), "email": _str(40)},
                                                                     required=["name"])},
        "location": _obj({"city": _str(30), "country": _str(30)}),
    }), ("Schedule a team lunch next Friday at noon in Berlin with Anna and Ben.",
         "Put the quarterly review on March 3rd at 9am in London.", "Plan a product launch in Tokyo in June.")),
    Case("sentiment", _obj({
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "keywords": {"type": "array", "maxItems": 5, "items": _str(20)},
    }), ("Classify: 'The battery lasts all day and the screen is gorgeous.'",
         "Classify: 'Shipping took a month and the box was crushed.'", "Classify: 'It is a phone. It makes calls.'")),
)


def request_body(case: Case, prompt: str, model: str, max_tokens: int, temperature: float) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "temperature": temperature,
            "messages": [{"role": "system", "content": "Answer with JSON only."},
                         {"role": "user", "content": prompt}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": case.name, "schema": case.schema, "strict": True}}}


@dataclass(frozen=True)
class Planned:
    case: Case | None  # None: an unconstrained request mixed in
    body: dict[str, Any]
    stream: bool


def plan(num_constrained: int, num_streamed: int, num_free: int, model: str, max_tokens: int,
         seed: int = 0, cases: tuple[Case, ...] | list[Case] = CASES, free_max_tokens: int = 48) -> list[Planned]:
    """`num_constrained` requests across `cases` (round robin), `num_streamed` of them streamed, with `num_free`
    unconstrained chat requests mixed in; shuffled with `seed`."""
    rng = random.Random(seed)
    out: list[Planned] = []
    for i in range(num_constrained):
        case = cases[i % len(cases)]
        prompt = case.prompts[(i // len(cases)) % len(case.prompts)]
        body = request_body(case, prompt, model, max_tokens, temperature=(0.0, 0.7)[i % 2])
        out.append(Planned(case, body, stream=i < num_streamed))
    for i in range(num_free):
        body = {"model": model, "max_tokens": free_max_tokens, "temperature": 0.7,
                "messages": [{"role": "user", "content": f"Tell me one fact about the number {i}."}]}
        out.append(Planned(None, body, stream=i % 2 == 0))
    rng.shuffle(out)
    return out
