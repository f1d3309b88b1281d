"""The gateway's entry module stays torch-free, and docs/gateway.md documents exactly the flags it has."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from flotilla_gateway.cli import parser

ROOT = Path(__file__).resolve().parents[2]


def test_the_entry_module_imports_neither_torch_nor_the_server_nor_the_operator() -> None:
    code = ("import sys, flotilla_gateway.cli, flotilla_gateway.app; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'flotilla_server', 'flotilla_operator', 'kopf')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_docs_list_every_flag() -> None:
    section = (ROOT / "docs/gateway.md").read_text().split("## Flags", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    documented = {flag for cell in first_cells for flag in re.findall(r"--[a-z-]+", cell)}
    flags = {s for action in parser()._actions for s in action.option_strings if s.startswith("--")} - {"--help"}
    assert flags == documented


def test_help_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "flotilla_gateway.cli", "--help"], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 0 and "--api-keys-file" in result.stdout


def test_a_bad_keys_file_stops_the_gateway_with_what_to_fix(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-a: {models: [tiny]}\n")
    result = subprocess.run([sys.executable, "-m", "flotilla_gateway.cli", "--api-keys-file", str(keys)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode != 0 and "needs a `tenant`" in result.stderr
