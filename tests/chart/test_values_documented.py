"""Every key of values.yaml is documented by the comment just above it, which starts with the key's name."""

from __future__ import annotations

import re

import yaml

from tests.chart.render import CHART

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[^\s#\-][^:]*):(?: |$)")
CAMEL_CASE = re.compile(r"^[a-z][a-zA-Z0-9]*$")


def undocumented_keys(text: str) -> list[str]:
    """Keys whose preceding comment block is missing or does not open with `# <key> `."""
    lines = text.splitlines()
    problems = []
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if not match:
            continue
        key, indent = match["key"], match["indent"]
        above = number - 1
        while above >= 0 and lines[above].startswith(f"{indent}#"):
            above -= 1
        block = lines[above + 1:number]
        if not block or not block[0].startswith(f"{indent}# {key} "):
            problems.append(f"line {number + 1}: {key}")
    return problems


def key_paths(node: object, prefix: str = "") -> set[str]:
    if not isinstance(node, dict):
        return set()
    paths = set()
    for key, value in node.items():
        paths.add(f"{prefix}{key}")
        paths |= key_paths(value, f"{prefix}{key}.")
    return paths


def test_every_values_key_is_documented() -> None:
    assert undocumented_keys((CHART / "values.yaml").read_text()) == []


def test_the_line_scan_sees_every_key() -> None:
    text = (CHART / "values.yaml").read_text()
    scanned = [line for line in text.splitlines() if KEY_LINE.match(line)]
    assert len(scanned) == len(key_paths(yaml.safe_load(text)))


def test_keys_are_camel_case() -> None:
    text = (CHART / "values.yaml").read_text()
    for line in text.splitlines():
        match = KEY_LINE.match(line)
        if match and "/" not in match["key"]:  # label keys (app.kubernetes.io/name) are data, not options
            assert CAMEL_CASE.match(match["key"]), f"values key {match['key']!r} is not camelCase"


def test_detects_a_missing_or_misnamed_comment() -> None:
    text = "# image is the image.\nimage:\n  # tag is the tag.\n  tag: x\n  pullPolicy: IfNotPresent\n"
    assert undocumented_keys(text) == ["line 5: pullPolicy"]
    assert undocumented_keys("# the replica count\nreplicaCount: 1\n") == ["line 2: replicaCount"]
