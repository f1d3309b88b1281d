"""Schemas whose compile takes long: each level is `anyOf` an object holding the level below twice, or an
array of it, so the grammar grows 3x a level (depth 8: 535 kB, ~0.5 s to compile on this machine's CPU)."""

from __future__ import annotations

from typing import Any


def nested_schema(depth: int, salt: int = 0) -> dict[str, Any]:
    """`salt` makes each schema distinct (no compile cache hit) at the same cost."""
    s: dict[str, Any] = {"type": "integer", "maximum": 1000 + salt}
    for _ in range(depth):
        s = {"anyOf": [{"type": "object", "properties": {"a": s, "b": s}, "required": ["a"]},
                       {"type": "array", "items": s}]}
    return s
