"""Every flag and environment variable docs/serving.md and docs/operator.md name is one the program's --help
shows, and every flag flotilla-server's --help shows is in serving.md's table.

A flag is attributed to the program its command line starts with (`flotilla-bench online --quick`); a flag
standing alone in serving.md belongs to flotilla-server; in operator.md to the operator, its `render`, or the
server whose pod arguments it describes. Flags of other programs (kubectl, helm, curl, hf) are not ours to check.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess

import pytest

from tests.docs.doc_blocks import ROOT, code_spans

HELP_COMMANDS = {
    "flotilla-server": ["flotilla-server"],
    "flotilla-operator": ["flotilla-operator"],
    "flotilla-operator render": ["flotilla-operator", "render"],
    "flotilla-bench": ["flotilla-bench"],
    "flotilla-bench offline": ["flotilla-bench", "offline"],
    "flotilla-bench online": ["flotilla-bench", "online"],
}
DOCS = {"docs/serving.md": ("flotilla-server",),
        "docs/operator.md": ("flotilla-operator", "flotilla-operator render", "flotilla-server")}
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
ENV = re.compile(r"\bFLOTILLA_[A-Z0-9_]+\b")
OTHER_PROGRAMS = re.compile(r"^\s*(?:\$ )?(kubectl|helm|curl|docker|pip|\.venv/bin/pip|make|git|hf)\b")


@functools.cache
def help_text(program: str) -> str:
    code_path = os.pathsep.join(str(ROOT / p) for p in ("contract", "server", "operator", "gateway"))
    command = [str(ROOT / ".venv" / "bin" / HELP_COMMANDS[program][0]), *HELP_COMMANDS[program][1:], "--help"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": code_path, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    return result.stdout


def programs_of(line: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """The program a command line runs (longest known prefix); () for another program's line."""
    stripped = re.sub(r"^\s*(\$ |\.venv/bin/)", "", line)
    for program in sorted(HELP_COMMANDS, key=len, reverse=True):
        if stripped.startswith(program + " ") or stripped == program:
            return (program,)
    return () if OTHER_PROGRAMS.match(line) or stripped.startswith("flotilla-") else default


def documented(doc: str) -> list[tuple[tuple[str, ...], str]]:
    """(the programs it may belong to, flag or variable) for each one `doc` names in its code."""
    found = []
    for span in code_spans(ROOT / doc):
        for line in span.replace("\\\n", " ").splitlines():
            for command in line.split(" | "):  # each side of a pipe is its own program's
                programs = programs_of(command, DOCS[doc])
                found += [(programs, flag) for flag in FLAG.findall(command) if programs]
                found += [(("flotilla-server",), var) for var in ENV.findall(command)]
    return found


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_flag_and_variable_a_doc_names_is_in_the_programs_help(doc: str):
    named = documented(doc)
    assert len({flag for _, flag in named}) >= 8, named  # the finder still finds the doc's flags
    unknown = sorted({(programs, flag) for programs, flag in named
                      if not any(flag in help_text(p) for p in programs)})
    assert unknown == [], f"{doc} names flags or variables that --help does not show: {unknown}"


def test_serving_md_documents_every_server_flag_and_variable():
    table = (ROOT / "docs" / "serving.md").read_text()
    shown = set(FLAG.findall(help_text("flotilla-server"))) - {"--help"}
    variables = set(ENV.findall(help_text("flotilla-server")))
    assert len(shown) >= 15 and len(variables) == len(shown)
    missing = sorted(f for f in shown | variables if f"`{f}`" not in table)
    assert missing == [], f"docs/serving.md's flag table lacks: {missing}"
