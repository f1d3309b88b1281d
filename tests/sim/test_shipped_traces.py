"""The Azure traces ship inside flotilla_sim, so `flotilla-sim fleet` runs from a fresh clone or an installed
wheel with nothing above the checkout; $FLOTILLA_TRACES still names another directory."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from flotilla_sim import workload
from flotilla_sim.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sim" / "flotilla_sim"
SHIPPED = ("traces/azure-llm-2023-conv.csv", "traces/azure-llm-2023-code.csv", "traces/README.md")


def test_the_traces_are_package_data_and_tracked_by_git():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data.get("flotilla_sim", []) + package_data.get("*", [])
    for name in SHIPPED:
        assert (PACKAGE / name).is_file(), name
        assert any(fnmatch.fnmatch(name, p) for p in patterns), f"{name} is not in pyproject.toml's package-data"
    ignored = subprocess.run(["git", "check-ignore", *(str(PACKAGE / n) for n in SHIPPED)], cwd=ROOT,
                             capture_output=True, text=True)
    assert ignored.returncode == 1 and ignored.stdout == "", f".gitignore ignores {ignored.stdout}"


def test_the_readme_gives_the_attribution_and_licence():
    text = (PACKAGE / "traces" / "README.md").read_text()
    for credit in ("CC BY 4.0", "https://creativecommons.org/licenses/by/4.0/",
                   "https://github.com/Azure/AzurePublicDataset", "Splitwise", "ISCA 2024", "unmodified"):
        assert credit in text, credit


def test_the_shipped_copy_is_the_default_and_flotilla_traces_overrides_it(monkeypatch, tmp_path):
    monkeypatch.delenv("FLOTILLA_TRACES", raising=False)
    assert workload.azure_traces() == PACKAGE / "traces"
    assert len(workload.read_azure("code")) == 8819  # the README's row count
    shutil.copy(PACKAGE / "traces" / "azure-llm-2023-code.csv", tmp_path)
    monkeypatch.setenv("FLOTILLA_TRACES", str(tmp_path))
    assert workload.azure_traces() == tmp_path and len(workload.read_azure("code")) == 8819
    with pytest.raises(InputError, match="unset FLOTILLA_TRACES to use the shipped traces"):
        workload.read_azure("conv")


def test_fleet_runs_from_a_copy_of_the_package_with_nothing_above_it(tmp_path):
    clone = tmp_path / "clone" / "sim"
    shutil.copytree(PACKAGE, clone / "flotilla_sim", ignore=shutil.ignore_patterns("__pycache__"))
    assert not any((parent / "shared" / "traces").is_dir() for parent in clone.parents)  # no ../shared
    env = {k: v for k, v in os.environ.items() if k != "FLOTILLA_TRACES"}
    env["PYTHONPATH"] = os.pathsep.join([str(clone), *(str(ROOT / p) for p in ("contract", "server", "operator", "gateway"))])
    # a tiny day: 2 models, 15-minute ticks and decisions, two policies
    argv = ["fleet", "--trace", "code", "--models", "2", "--gpus", "4", "--tick-s", "900", "--interval-s", "900",
            "--policies", "static-peak,latency-first", "--quiet", "--out", str(tmp_path / "out")]
    code = ("import sys, flotilla_sim.cli as cli, flotilla_sim.workload as w; "
            "print(w.azure_traces(), file=sys.stderr); cli.main(sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == str(clone / "flotilla_sim" / "traces")  # the copy's own traces
    result = json.loads((tmp_path / "out" / "fleet-day-code.json").read_text())
    assert result["scenario"]["requests"] > 0 and set(result["policies"]) == {"static-peak", "latency-first"}
