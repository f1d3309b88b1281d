"""The schemas that probe the engines' edges rather than their everyday speed: generators of pathological
schemas (linear in size, compile cost that may not be) with the sizes the pathological section tries, and
the JSON Schema keyword table the coverage section checks each engine against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# ----------------------------------------------------------------------------------------------------------
# Pathological schemas: linear in size, compile cost that may not be.

def nested_objects(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for i in range(depth):
        node = {"type": "object", "properties": {f"k{i}": node, "n": {"type": "integer"}},
                "required": [f"k{i}"], "additionalProperties": False}
    return node


def nested_anyof(depth: int) -> dict[str, Any]:
    """anyOf at every level, the next level referenced once: the schema grows linearly."""
    node: dict[str, Any] = {"type": "string"}
    for i in range(depth):
        node = {"anyOf": [
            {"type": "object", "properties": {f"c{i}": node}, "required": [f"c{i}"], "additionalProperties": False},
            {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
            {"type": "integer"},
        ]}
    return node


def nested_anyof_x2(depth: int) -> dict[str, Any]:
    """anyOf at every level, the next level referenced twice (a property and array items), inlined: the
    schema text grows 4x a level (what a client's generator that inlines $refs sends)."""
    node: dict[str, Any] = {"type": "string"}
    for i in range(depth):
        node = {"anyOf": [
            {"type": "object", "properties": {f"c{i}": node}, "required": [f"c{i}"], "additionalProperties": False},
            {"type": "array", "items": node, "maxItems": 2},
            {"type": "integer"},
        ]}
    return node


def nested_oneof(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "null"}
    for i in range(depth):
        node = {"oneOf": [
            {"type": "object", "properties": {"v": node, "t": {"type": "string", "enum": [f"t{i}"]}},
             "required": ["v"]},
            {"type": "string"},
        ]}
    return node


def huge_enum(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"code": {"type": "string", "enum": [f"item-{i:06d}-{(i * 7919) % 10007}"
                                                                              for i in range(n)]}},
            "required": ["code"], "additionalProperties": False}


def long_bounded_string(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"s": {"type": "string", "minLength": n // 2, "maxLength": n},
                                             "a": {"type": "array", "items": {"type": "integer"}, "maxItems": n}},
            "required": ["s", "a"], "additionalProperties": False}


PATHOLOGICAL: dict[str, tuple[Callable[[int], dict[str, Any]], tuple[int, ...]]] = {
    "nested_objects": (nested_objects, (10, 25, 50)),
    "nested_anyof": (nested_anyof, (10, 25, 50)),
    "nested_anyof_x2": (nested_anyof_x2, (4, 6, 8, 10, 12)),
    "nested_oneof": (nested_oneof, (8, 16, 32, 50)),
    "huge_enum": (huge_enum, (1000, 10000, 50000)),
    "bounded_lengths": (long_bounded_string, (100, 1000, 10000)),
}


# ----------------------------------------------------------------------------------------------------------
# JSON Schema keyword coverage: (keyword, schema, conforming instance, violating instance or None)

COVERAGE: list[tuple[str, dict[str, Any], Any, Any]] = [
    ("type list (string|null)", {"type": ["string", "null"]}, None, 3),
    ("const", {"const": "x"}, "x", "y"),
    ("enum (mixed)", {"enum": ["a", 1, None]}, 1, 2),
    ("minLength", {"type": "string", "minLength": 3}, "abc", "ab"),
    ("maxLength", {"type": "string", "maxLength": 3}, "abc", "abcd"),
    ("pattern", {"type": "string", "pattern": "^[a-z]{2}-[0-9]{3}$"}, "ab-123", "AB-12"),
    ("format: date-time", {"type": "string", "format": "date-time"}, "2027-01-02T03:04:05Z", "yesterday"),
    ("format: date", {"type": "string", "format": "date"}, "2027-01-02", "2027-13-45x"),
    ("format: email", {"type": "string", "format": "email"}, "ada@example.org", "not an email"),
    ("format: uuid", {"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "xyz"),
    ("format: uri", {"type": "string", "format": "uri"}, "https://example.org/a", "::not a uri::"),
    ("format: ipv4", {"type": "string", "format": "ipv4"}, "192.0.2.1", "999.1"),
    ("minimum (integer)", {"type": "integer", "minimum": 10}, 10, 9),
    ("maximum (integer)", {"type": "integer", "maximum": 10}, 10, 11),
    ("exclusiveMinimum (integer)", {"type": "integer", "exclusiveMinimum": 0}, 1, 0),
    ("exclusiveMaximum (number)", {"type": "number", "exclusiveMaximum": 1.5}, 1.25, 1.5),
    ("minimum (number, negative)", {"type": "number", "minimum": -2.5}, -2.5, -3),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, 15, 7),
    ("minItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 2], [1]),
    ("maxItems", {"type": "array", "items": {"type": "integer"}, "maxItems": 2}, [1, 2], [1, 2, 3]),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     ["a", 1], [1, "a"]),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, [1, 3], [1, 2]),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1}, {}),
    ("additionalProperties: false", {"type": "object", "properties": {"a": {"type": "integer"}},
                                     "additionalProperties": False}, {"a": 1}, {"a": 1, "b": 2}),
    ("additionalProperties: schema", {"type": "object", "additionalProperties": {"type": "integer"}},
     {"x": 1}, {"x": "s"}),
    ("additionalProperties omitted (extra key allowed?)", {"type": "object", "properties": {"a": {"type": "integer"}}},
     {"a": 1, "b": 2}, None),
    ("patternProperties", {"type": "object", "patternProperties": {"^n_": {"type": "integer"}},
                           "additionalProperties": False}, {"n_a": 1}, {"s_a": 1}),
    ("propertyNames", {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, {"ab": 1}, {"AB": 1}),
    ("minProperties", {"type": "object", "minProperties": 1}, {"a": 1}, {}),
    ("maxProperties", {"type": "object", "maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2}),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    ("$ref / $defs", {"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/n"}},
                      "required": ["x"]}, {"x": 1}, {"x": "1"}),
    ("$ref recursive", {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v", "kids"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     {"v": 1, "kids": [{"v": 2, "kids": []}]}, {"v": 1, "kids": [{"v": "2", "kids": []}]}),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "s", True),
    ("oneOf (overlapping branches)", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1.5, 1),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     {"a": 1, "b": "x"}, {"a": 1}),
    ("not", {"not": {"type": "string"}}, 1, "s"),
    ("if/then/else", {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {}}, "required": ["k", "v"],
                      "if": {"properties": {"k": {"const": "a"}}}, "then": {"properties": {"v": {"type": "integer"}}},
                      "else": {"properties": {"v": {"type": "string"}}}}, {"k": "a", "v": 1}, {"k": "a", "v": "x"}),
    ("unknown keyword (x-foo)", {"type": "integer", "x-foo": 1}, 1, None),
]
