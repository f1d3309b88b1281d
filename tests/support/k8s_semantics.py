"""Pure pieces of Kubernetes API semantics the emulator needs: patches, selectors, object metadata.

Kept apart from the HTTP shell (`k8s_emulator.py`) so each rule is a small function.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")] if path else []


def json_patch(target: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 JSON patch (add, remove, replace, test), enough for kubectl and kopf."""
    doc = copy.deepcopy(target)
    for op in operations:
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        kind = op["op"]
        if kind == "test":
            current = node[int(last)] if isinstance(node, list) else node.get(last)
            if current != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif kind == "remove":
            if isinstance(node, list):
                del node[int(last)]
            else:
                del node[last]
        elif kind in ("add", "replace"):
            if isinstance(node, list):
                index = len(node) if last == "-" else int(last)
                if kind == "add":
                    node.insert(index, op["value"])
                else:
                    node[index] = op["value"]
            else:
                node[last] = op["value"]
        else:
            raise ValueError(f"unsupported JSON patch op {kind!r}")
    return doc


def parse_label_selector(selector: str | None) -> list[tuple[str, str, tuple[str, ...]]]:
    """`a=b,c!=d,e,!f,g in (h,i)` as (key, operator, values) triples."""
    if not selector:
        return []
    terms: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(selector):  # commas inside `in (…)` do not split terms
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(selector[start:index])
            start = index + 1
    terms.append(selector[start:])
    parsed = []
    for term in (t.strip() for t in terms if t.strip()):
        if " notin " in term or " in " in term:
            key, op, rest = term.partition(" notin ") if " notin " in term else term.partition(" in ")
            values = tuple(v.strip() for v in rest.strip().strip("()").split(","))
            parsed.append((key.strip(), op.strip(), values))
        elif "!=" in term:
            key, _, value = term.partition("!=")
            parsed.append((key.strip(), "!=", (value.strip(),)))
        elif "=" in term:
            key, _, value = term.replace("==", "=").partition("=")
            parsed.append((key.strip(), "=", (value.strip(),)))
        elif term.startswith("!"):
            parsed.append((term[1:].strip(), "!", ()))
        else:
            parsed.append((term, "exists", ()))
    return parsed


def labels_match(labels: dict[str, str], selector: str | None) -> bool:
    for key, op, values in parse_label_selector(selector):
        value = labels.get(key)
        if op == "=":
            ok = value is not None and value == values[0]
        elif op == "!=":
            ok = value != values[0]
        elif op == "in":
            ok = value is not None and value in values
        elif op == "notin":
            ok = value not in values
        elif op == "exists":
            ok = key in labels
        else:  # "!": absent
            ok = key not in labels
        if not ok:
            return False
    return True


def fields_match(obj: dict[str, Any], selector: str | None) -> bool:
    """Field selectors on metadata.name / metadata.namespace, the ones clients actually use."""
    for key, op, values in parse_label_selector(selector):
        node: Any = obj
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (op == "=" and node != values[0]) or (op == "!=" and node == values[0]):
            return False
    return True


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def body_of(obj: dict[str, Any]) -> dict[str, Any]:
    """What `metadata.generation` tracks: everything but metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}
