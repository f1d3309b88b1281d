"""Structured access logs: one JSON object per request on the `flotilla_gateway.access` logger, and a
formatter that writes every gateway log record as one JSON line (for Loki, Elasticsearch, `jq`)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

access = logging.getLogger("flotilla_gateway.access")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                                 + f".{int(record.msecs):03d}Z",
                                 "level": record.levelname.lower(), "logger": record.name}
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def log_request(**fields: Any) -> None:
    access.info("request", extra={"fields": fields})


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("flotilla_gateway")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
