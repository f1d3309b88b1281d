"""The alert rules load in Prometheus, and each alert fires on a series that should trigger it and no other."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.render import CHART, one, render

RULES = CHART / "files" / "prometheus-rules.yaml"
UNIT_TESTS = Path(__file__).parent / "alerts_test.yaml"
ALERTS = {
    "FlotillaQueueWaitHigh",
    "FlotillaClassQueueWaitHigh",
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


def rendered_rules(tmp_path: Path, *sets: str) -> Path:
    """The chart's PrometheusRule spec (the alert file plus the class SLOs from values) as a rule file."""
    rule = one(render("default", "prometheusRule.enabled=true", *sets), "PrometheusRule", component="alerts")
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


def class_slo_tests(rules: Path, firing: bool) -> dict:
    """One interactive model waiting 2.425 s at p95 for 20 minutes, against whatever SLO the rules record."""
    buckets = {"0.5": "0x40", "1": "0x40", "2.5": "0+10x40", "+Inf": "0+10x40"}
    series = [{"series": f'flotilla_class_queue_wait_seconds_bucket{{namespace="team-a", model="chat", pod="chat-0", '
                         f'class="interactive", tenant="a", le="{le}"}}', "values": values}
              for le, values in buckets.items()]
    rule = next(r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "FlotillaClassQueueWaitHigh")
    description = rule["annotations"]["description"]
    for name, value in (("class", "interactive"), ("model", "chat")):
        description = description.replace(f"{{{{ $labels.{name} }}}}", value)
    alerts = [{"exp_labels": {"severity": "warning", "namespace": "team-a", "model": "chat", "class": "interactive"},
               "exp_annotations": {"summary": "team-a/chat: interactive p95 queue wait 2.425s",
                                   "description": description}}]
    return {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [{"eval_time": "20m", "alertname": "FlotillaClassQueueWaitHigh",
                             "exp_alerts": alerts if firing else []}]}]}


@pytest.mark.parametrize(("sets", "firing"), [
    ((), True),  # the default interactive SLO, 1 s
    (("prometheusRule.classQueueWaitSLOSeconds.interactive=3",), False),  # 2.425 s is within a 3 s SLO
])
def test_class_queue_wait_slos_come_from_the_chart_values(tmp_path: Path, sets: tuple[str, ...], firing: bool) -> None:
    rules = rendered_rules(tmp_path, *sets)
    groups = {g["name"]: g["rules"] for g in yaml.safe_load(rules.read_text())["groups"]}
    slos = {r["labels"]["class"]: r["expr"] for r in groups["flotilla.class-slos"]}
    assert slos == {"interactive": "vector(3)" if sets else "vector(1)", "batch": "vector(300)"}
    test_file = tmp_path / "class_slo_test.yaml"
    test_file.write_text(yaml.safe_dump(class_slo_tests(rules, firing)))
    result = promtool("test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr
