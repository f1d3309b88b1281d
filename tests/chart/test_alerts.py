"""The alert rules load in Prometheus, and each alert fires on a series that should trigger it and no other."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.chart.render import CHART

RULES = CHART / "files" / "prometheus-rules.yaml"
UNIT_TESTS = Path(__file__).parent / "alerts_test.yaml"
ALERTS = {
    "FlotillaQueueWaitHigh",
    "FlotillaSustained429s",
    "FlotillaKVCacheSaturated",
    "FlotillaNoReadyReplicas",
    "FlotillaAutoscalerPinnedAtMax",
    "FlotillaOperatorPrometheusQueriesFailing",
    "FlotillaGatewayRequestsHeldLong",
    "FlotillaModelPoolThrashing",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=UNIT_TESTS.parent)


def test_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_severity_summary_and_description() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert rule.get("for"), f"{rule['alert']} must be sustained (for:) to avoid paging on blips"


def test_every_alert_has_a_firing_unit_test() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    firing = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case.get("exp_alerts")}
    assert firing == ALERTS


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """Guards the guard: with the KV threshold lowered to 90% the silent 0.95 pod fires, and the tests fail."""
    (tmp_path / "charts" / "flotilla" / "files").mkdir(parents=True)
    (tmp_path / "tests" / "chart").mkdir(parents=True)
    loosened = RULES.read_text().replace("(flotilla_kv_cache_usage_ratio) > 0.95", "(flotilla_kv_cache_usage_ratio) > 0.90")
    assert loosened != RULES.read_text()
    (tmp_path / "charts" / "flotilla" / "files" / RULES.name).write_text(loosened)
    (tmp_path / "tests" / "chart" / UNIT_TESTS.name).write_text(UNIT_TESTS.read_text())
    result = subprocess.run(["promtool", "test", "rules", UNIT_TESTS.name], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path / "tests" / "chart")
    assert result.returncode != 0
    assert "FlotillaKVCacheSaturated" in result.stdout + result.stderr
