"""What the API server does with a custom resource's structural schema: prune, default, validate, CEL.

Validation is jsonschema (the schema is OpenAPI v3, close to draft 4) plus the
`x-kubernetes-validations` rules evaluated with cel-python, `self` bound to the node that carries
them. Rules run only when the object is otherwise valid, as on a real API server.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import celpy
import jsonschema

ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def prune(schema: dict[str, Any], value: Any, is_root: bool = True) -> Any:
    """Drop fields the schema does not know, unless it preserves unknown fields there."""
    if isinstance(value, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return value
        if "additionalProperties" in schema:
            return {k: prune(schema["additionalProperties"], v, False) for k, v in value.items()}
        props = schema.get("properties", {})
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
        envelope = ROOT_FIELDS if is_root else ()  # the API server keeps these whatever the schema lists
        return {
            k: (v if k in envelope else prune(props[k], v, False)) if k in props or k in envelope else v
            for k, v in value.items() if k in props or k in envelope or keep_unknown
        }
    if isinstance(value, list) and "items" in schema:
        return [prune(schema["items"], item, False) for item in value]
    return value


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """A copy of `obj` with every missing defaulted field filled, nested defaults included."""
    obj = copy.deepcopy(prune(schema, obj))
    _default(schema, obj)
    return obj


def _default(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                _default(prop, value[name])
        if isinstance(schema.get("additionalProperties"), dict):
            for item in value.values():
                _default(schema["additionalProperties"], item)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default(schema["items"], item)


_ENV = celpy.Environment()  # built once, at import: constructing one raises the recursion limit


@functools.cache
def _program(rule: str) -> Any:
    return _ENV.program(_ENV.compile(rule))


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Messages of the CEL rules that `value` breaks, each prefixed with where it applies."""
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            ok = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except Exception as error:  # a rule that cannot evaluate rejects, as on the API server
            errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])} (rule error: {error})")
            continue
        if isinstance(ok, celpy.celtypes.BoolType | bool) and bool(ok):
            continue
        errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                errors += cel_errors(prop, value[name], f"{path}.{name}" if path else name)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def validate(schema: dict[str, Any], obj: Any) -> list[str]:
    """Every reason the API server would reject `obj` (empty when it is accepted)."""
    validator = jsonschema.Draft4Validator(schema)
    errors = [f"{_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]
    return errors or cel_errors(schema, obj)


def admit(schema: dict[str, Any], obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The stored form of `obj` (pruned, defaulted) and the reasons it is refused, if any."""
    stored = apply_defaults(schema, obj)
    return stored, validate(schema, stored)
