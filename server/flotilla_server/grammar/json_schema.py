"""A request's JSON schema made into llguidance grammar text, after the checks that name what is wrong.

The JSON comes out compact but readable: one space after `,` and `:` and no other whitespace, so a model can
never spend its tokens on runaway indentation. Properties keep the schema's order, as OpenAI's do, so the
grammar text (the compile caches' key) is the schema as sent, re-serialised without spaces.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import llguidance

# llguidance's JSON compile options (its JsonCompileOptions); a schema's own "x-guidance" overrides them
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# the drafts whose metaschemas jsonschema_rs holds: any other `$schema` would be fetched over the network
KNOWN_DRAFTS = frozenset(f"{scheme}://json-schema.org/{draft}" for scheme in ("http", "https") for draft in (
    "draft-04/schema", "draft-06/schema", "draft-07/schema", "draft/2019-09/schema", "draft/2020-12/schema"))


class GrammarError(ValueError):
    """A schema or tool definition that cannot become a grammar: a 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_schema(schema: Any, param: str) -> dict[str, Any]:
    """`schema` if it is a valid JSON Schema object (its own `$schema` draft, else 2020-12); else GrammarError.
    jsonschema_rs: a 500 kB schema checks in 7 ms, where the pure-Python `jsonschema` took 3.6 s on the event
    loop."""
    if not isinstance(schema, dict):
        raise GrammarError(f"{param} must be a JSON Schema object, got {type(schema).__name__}.", param)
    draft = schema.get("$schema")
    if draft is not None and (not isinstance(draft, str) or draft.rstrip("#") not in KNOWN_DRAFTS):
        raise GrammarError(f"{param}.$schema is {draft!r}: use one of the JSON Schema drafts 4, 6, 7, 2019-09 or "
                           "2020-12 (https://json-schema.org/draft/2020-12/schema), or leave $schema out.", param)
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as e:
        where = "/".join(str(p) for p in e.instance_path)
        at = f" at {where}" if where else ""
        raise GrammarError(f"{param} is not a valid JSON Schema{at}: {e.message[:300]}", param) from None
    return schema


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def schema_grammar(schema: Any, param: str) -> str:
    """The grammar of one JSON value valid under `schema`; keywords llguidance cannot enforce are refused
    when it compiles (compile_gate.py), naming the keyword."""
    checked = check_schema(schema, param)
    return llguidance.LLMatcher.grammar_from_json_schema(schema_text(checked), defaults=JSON_OPTIONS)
