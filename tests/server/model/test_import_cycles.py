"""`make lint`'s cycle contract (.importlinter-cycles) fails on a cycle planted in model/, a type-only one too.

lint-imports runs with that config on a copy of model/ in a temporary directory, so the real tree never
holds a planted import; the copy without a plant must pass, which also shows the real model/ is acyclic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.examples import ROOT

CONFIG = ROOT / ".importlinter-cycles"
MODEL = ROOT / "server" / "flotilla_server" / "model"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# the cycle this contract was made for: gguf_loader imports gguf_tokenizer, which named a type of gguf_loader
TYPE_ONLY = "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .gguf_loader import load_gguf\n"
# test id -> ({module of model/: text appended to it, a new module when there is none}, the modules on the cycle)
PLANTS = {
    "acyclic": ({}, ()),
    "runtime-cycle": ({"_planted_a": "from . import _planted_b\n", "_planted_b": "from . import _planted_a\n"},
                      ("_planted_a", "_planted_b")),
    "type-only-cycle": ({"gguf_tokenizer": TYPE_ONLY}, ("gguf_loader", "gguf_tokenizer")),
}


def copy_of_model(root: Path, plant: dict[str, str]) -> None:
    package = root / "flotilla_server"
    shutil.copytree(MODEL, package / "model", ignore=shutil.ignore_patterns("__pycache__", "build"))
    (package / "__init__.py").write_text("")
    for module, text in plant.items():
        path = package / "model" / f"{module}.py"
        path.write_text((path.read_text() if path.exists() else "") + text)


@pytest.mark.parametrize(("plant", "cycle"), PLANTS.values(), ids=PLANTS.keys())
def test_the_cycle_contract_fails_on_any_cycle_in_model(tmp_path: Path, plant: dict[str, str],
                                                         cycle: tuple[str, ...]) -> None:
    copy_of_model(tmp_path, plant)
    result = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", str(CONFIG)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    report = result.stdout + result.stderr
    assert result.returncode == (1 if cycle else 0), report
    if cycle:
        assert "No cycles are allowed in flotilla_server.model." in report
        for module in cycle:  # the report names the import that would break it: both ends are on the cycle
            assert f".{module} " in report, report
