"""Times as the Kubernetes API writes them: RFC 3339 in UTC with a `Z`, to the millisecond.

One formatter for every time the operator writes (condition transitions, Events, the autoscaler's
history in `status.autoscaler`), so they compare and sort the same way everywhere.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def format_time(time_s: float) -> str:
    """Seconds since the epoch → "2026-01-02T03:04:05.678Z"."""
    return datetime.fromtimestamp(time_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now() -> str:
    return format_time(time.time())


def parse_time(text: str) -> float:
    """The inverse of format_time; also reads whole-second times ("...:05Z") that others write."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
