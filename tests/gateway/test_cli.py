"""The gateway's entry module stays torch-free, docs/gateway.md documents exactly the flags it has, and a
file it cannot start with stops it with one line and exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from flotilla_gateway.cli import main, parser

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


BAD_KEYS = {
    "the `model` typo": ("sk-a: {tenant: t, model: [tiny]}\n", "unknown field `model` (did you mean `models`?)"),
    "an unknown field": ("sk-a: {tenant: t, models: [tiny], modles: [big]}\n", "unknown field `modles`"),
    "an empty entry": ("sk-a:\n", "has an empty entry"),
    "no models": ("sk-a: {tenant: t}\n", "has no `models`"),
}


@pytest.mark.parametrize(("text", "problem"), BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_a_bad_keys_file_stops_the_start_with_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(text)
    with pytest.raises(SystemExit) as caught:
        main(["--api-keys-file", str(keys)])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and problem in err
    assert err.startswith(f"flotilla-gateway: the keys file {keys}: key sk-a…") and err.count("\n") == 1


def test_the_real_process_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-a: {tenant: t, model: [tiny]}\n")
    result = subprocess.run([sys.executable, "-m", "flotilla_gateway.cli", "--api-keys-file", str(keys)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "did you mean `models`?" in result.stderr, result.stderr


def test_a_reload_interval_must_be_above_0(capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("0", "-1", "soon"):
        with pytest.raises(SystemExit) as caught:
            parser().parse_args(["--api-keys-reload-interval-s", value])
        assert caught.value.code == 2 and "is not a number of seconds above 0" in capsys.readouterr().err
