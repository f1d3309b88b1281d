"""Kubernetes quantities compared by value, because the API server rewrites them.

A real API server stores `cpu: 0.5` as `500m` and `memory: 1.5Gi` as `1536Mi`; comparing the strings
would see drift on every read and rewrite the Deployment once per drift tick (docs/architecture.md,
"Plan, then apply").
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
_FACTOR = {"": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
           "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
           "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
           "Pi": Decimal(2**50), "Ei": Decimal(2**60)}
QUANTITY_KEYS = frozenset({"limits", "requests", "sizeLimit"})  # where, in a pod spec, values are quantities


def parse_quantity(text: str | int | float) -> Decimal | None:
    """The value of a quantity (`500m` → 0.5, `1536Mi` → 1610612736), or None if `text` is not one."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        return None
    suffix = match.group(2) or ""
    try:
        number = Decimal(match.group(1))
        factor = Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _FACTOR[suffix]
    except (InvalidOperation, ValueError):
        return None
    return number * factor


def same_quantity(desired: object, live: object) -> bool:
    """Equal as quantities (`0.5` and `500m`), or equal as they are when either is not a quantity."""
    if desired == live:
        return True
    if not isinstance(desired, str | int | float) or not isinstance(live, str | int | float):
        return False
    a, b = parse_quantity(desired), parse_quantity(live)
    return a is not None and b is not None and a == b
