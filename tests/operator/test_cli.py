"""`flotilla-operator` flags: parsed into settings, and user mistakes answered with what to change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from flotilla_operator.cli import build_parser, settings_from_args
from flotilla_operator.settings import OperatorSettings
from flotilla_operator.types import DEFAULT_SERVER_IMAGE


def parse(*argv: str) -> OperatorSettings:
    return settings_from_args(build_parser().parse_args(list(argv)))


def test_defaults():
    settings = parse("--namespace", "ml")
    assert settings.namespaces == ("ml",) and not settings.all_namespaces
    assert settings.default_image == DEFAULT_SERVER_IMAGE
    assert settings.standalone and settings.peering is None
    assert (settings.health_port, settings.metrics_port) == (8081, 8080)
    assert (settings.autoscale_interval_s, settings.drift_interval_s) == (15.0, 60.0)


def test_every_flag():
    settings = parse("-n", "a", "-n", "b", "--prometheus-url", "http://prom:9090", "--default-image", "img:2",
                     "--peering", "flotilla", "--verbose", "--health-port", "1", "--metrics-port", "2",
                     "--autoscale-interval-s", "3", "--drift-interval-s", "4")
    assert settings.namespaces == ("a", "b") and settings.prometheus_url == "http://prom:9090"
    assert settings.default_image == "img:2" and settings.peering == "flotilla" and not settings.standalone
    assert settings.verbose and (settings.health_port, settings.metrics_port) == (1, 2)
    assert (settings.autoscale_interval_s, settings.drift_interval_s) == (3.0, 4.0)
    assert parse("--all-namespaces").all_namespaces


@pytest.mark.parametrize(("argv", "message"), [
    ([], "give --namespace NAME (repeatable) or --all-namespaces"),
    (["-n", "a", "--all-namespaces"], "not allowed with argument"),
    (["-n", "a", "--drift-interval-s", "0"], "must be > 0"),
    (["-n", "a", "--peering", "x", "--standalone"], "not allowed with argument"),
])
def test_mistakes_exit_2_with_a_message(argv, message):
    result = subprocess.run([sys.executable, "-m", "flotilla_operator.cli", *argv],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr


def test_without_a_cluster_it_says_so_in_one_line_and_exits_2(tmp_path, monkeypatch, capsys):
    from flotilla_operator.cli import main

    for name in [k for k in os.environ if k.startswith("KUBERNETES_")]:
        monkeypatch.delenv(name)  # not in a pod
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    assert main(["--all-namespaces"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flotilla-operator: error: no cluster credentials")
    assert "KUBECONFIG" in err and err.count("\n") == 1 and "Traceback" not in err
