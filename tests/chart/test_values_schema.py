"""values.schema.json describes exactly the keys of values.yaml, so helm refuses a misspelt or mistyped value."""

from __future__ import annotations

import json

import jsonschema
import yaml

from tests.chart.render import ALL_OPTIONS, CHART

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def schema_paths(schema: dict, prefix: str = "") -> set[str]:
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        paths.add(prefix + key)
        paths |= schema_paths(sub, f"{prefix}{key}.")
    return paths


def value_paths(values: dict, schema: dict, prefix: str = "") -> set[str]:
    """Key paths of values.yaml, not descending into maps the schema leaves free-form (labels, resources)."""
    paths = set()
    for key, value in values.items():
        paths.add(prefix + key)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and "properties" in sub:
            paths |= value_paths(value, sub, f"{prefix}{key}.")
    return paths


def test_schema_and_values_have_the_same_keys() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema_paths(SCHEMA) - {"global"} == value_paths(values, SCHEMA)


def test_every_structured_object_refuses_unknown_keys() -> None:
    def objects(schema: dict, path: str = "") -> list[tuple[str, dict]]:
        found = [(path, schema)] if schema.get("type") == "object" and "properties" in schema else []
        for key, sub in schema.get("properties", {}).items():
            found += objects(sub, f"{path}.{key}")
        return found

    for path, schema in objects(SCHEMA):
        assert schema.get("additionalProperties") is False, f"{path or 'values'} accepts unknown keys"


def test_default_and_all_options_values_are_valid() -> None:
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), SCHEMA)
    jsonschema.validate(yaml.safe_load(ALL_OPTIONS.read_text()), SCHEMA)
