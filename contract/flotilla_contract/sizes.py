"""Byte sizes as users write them: Kubernetes quantities (`8Gi`, `512Mi`, `1.5G`) or plain bytes."""

from __future__ import annotations

import re

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(m|Ki|Mi|Gi|Ti|K|M|G|T|k)?B?\s*$")
_FACTOR = {None: 1, "m": 1e-3, "K": 10**3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

MiB = 2**20
GiB = 2**30


def parse_bytes(text: str) -> int:
    """'8Gi', '512Mi', '2G', '1048576' → bytes; raises ValueError that says what to write."""
    match = _QUANTITY.match(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a size: write bytes, or a number with Ki, Mi, Gi, K, M or G (e.g. 8Gi)")
    return int(float(match.group(1)) * _FACTOR[match.group(2)])
