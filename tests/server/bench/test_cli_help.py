"""flotilla-bench's --help is written for users: what each benchmark does, every mode, every default."""

from __future__ import annotations

import pytest
from flotilla_server.bench.cli import main
from flotilla_server.bench.offline import MODES
from flotilla_server.bench.workloads import QUICK_WORKLOADS, WORKLOADS

from tests.docs.doc_blocks import ROOT


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_speaks_to_users_not_to_maintainers(capsys):
    text = help_of(capsys)
    assert "add_arguments" not in text and "imported lazily" not in text
    assert "docs/benchmarks.md" in text


def test_offline_help_names_every_mode(capsys):
    text = " ".join(help_of(capsys).split())
    for mode in MODES:
        assert mode in text, mode


def test_online_help_shows_defaults_and_a_quick_run(capsys):
    text = help_of(capsys, "online")
    assert "--quick" in text
    assert "(default: 200)" in text and "(default: completions)" in text


def test_benchmarks_md_names_every_workload():
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = [name for name in {*WORKLOADS, *QUICK_WORKLOADS} if f"`{name}`" not in doc]
    assert missing == [], missing
