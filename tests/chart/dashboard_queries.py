"""Reads the Grafana dashboards as data: panels, their PromQL, and the variables they use.

Shared by the static dashboard tests and e2e/test_dashboards.py, which evaluates every query against
a real Prometheus. Grafana's variables are substituted the way Grafana would for one selection.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "dashboards"
# $__rate_interval is at least 4 scrape intervals in Grafana; 1m covers any scrape interval up to 15 s.
BUILTIN_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
METRIC_NAME = re.compile(r"\b(?:flotilla|vllm)[a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # dashboard title
    panel: str  # panel title
    ref_id: str
    expr: str
    legend: str

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.panel} / {self.ref_id}"


def load_dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def queries(dashboard: dict) -> list[PanelQuery]:
    return [PanelQuery(dashboard["title"], p["title"], t["refId"], t["expr"], t.get("legendFormat", ""))
            for p in panels(dashboard) for t in p.get("targets", [])]


def variables(dashboard: dict) -> list[dict]:
    return dashboard["templating"]["list"]


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replaces $name and ${name} as Grafana does; an unknown variable is an error, never left in."""
    everything = {**BUILTIN_VARIABLES, **values}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in everything:
            raise KeyError(f"variable ${name} is not defined by the dashboard")
        return everything[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def metric_names(expr: str) -> set[str]:
    """Metric names in a query (flotilla_* and vllm:*), without label names or values."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(METRIC_NAME.findall(without_strings))
