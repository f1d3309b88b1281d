"""Every file the docs name exists, every `make` target they name is in the Makefile, every link resolves,
and what the documented commands write lands where git ignores it."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.docs.doc_blocks import ROOT, code_spans, doc_files, markdown_files, shell_blocks

# the tracked top-level folders: a path under one of them must exist (bench-results/ and other outputs are not)
TOP_LEVEL = tuple(sorted({f.split("/", 1)[0] + "/" for f in subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines() if "/" in f}))
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".txt", ".toml", ".sh", ".png", ".tpl", ".cfg", ".ini")
# where a path written relative to a package (`engine/core.py`, `model/linear.py`) is found
PACKAGE_ROOTS = ("server/flotilla_server", "operator/flotilla_operator", "contract/flotilla_contract",
                 "gateway/flotilla_gateway", "charts/flotilla")
PATH_TOKEN = re.compile(r"(?<![\w./:~$-])((?:[\w.-]+/)+[\w.-]+/?)")
MAKE_TARGET = re.compile(r"\bmake((?:\s+-\w(?:\s+\S+)?)*)\s+([a-z][\w-]*)")


def named_paths(path: Path) -> set[str]:
    """Repository paths a doc names in its code: top-level folders' files, and package-relative module paths."""
    found = set()
    for span in code_spans(path):
        for token in PATH_TOKEN.findall(span):
            if "*" in token or "{" in token or token.startswith(("http", "www.")):
                continue
            if token.startswith(TOP_LEVEL) or token.endswith(FILE_SUFFIXES):
                found.add(token.rstrip("."))
    return found


def exists(token: str, doc: Path) -> bool:
    """`token` as a path from the root, the doc, or a package; `e2e/load.LoadGenerator` names e2e/load.py."""
    module = re.sub(r"\.\w+$", ".py", token) if not token.endswith(FILE_SUFFIXES) else token
    candidates = [base / name for name in {token, module}
                  for base in (ROOT, doc.parent, *(ROOT / root for root in PACKAGE_ROOTS))]
    return any(c.exists() for c in candidates)


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path):
    missing = sorted(t for t in named_paths(doc) if t.startswith(TOP_LEVEL) and not exists(t, doc))
    missing += sorted(t for t in named_paths(doc) if not t.startswith(TOP_LEVEL) and t.endswith(".py")
                      and not exists(t, doc))
    assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path):
    prose = re.sub(r"`[^`\n]+`", "", re.sub(r"```.*?```", "", doc.read_text(), flags=re.S))
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose)
    broken = [link for link in links if "://" not in link and not (doc.parent / link).exists()]
    assert broken == [], f"{doc.relative_to(ROOT)} links to missing files: {broken}"


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*)\s*:(?!=)", text, re.M))


def test_every_make_target_the_docs_name_exists():
    targets = makefile_targets()
    named = {(doc.relative_to(ROOT), m.group(2)) for doc in doc_files() for span in code_spans(doc)
             for m in MAKE_TARGET.finditer(span)}
    assert {t for _, t in named} >= {"run", "test", "bench"}, named  # the finder still finds what the README says
    missing = sorted((str(doc), t) for doc, t in named if t not in targets)
    assert missing == [], f"the docs name make targets the Makefile lacks: {missing}"


def written_files() -> list[tuple[str, str]]:
    """(where, path) for what a documented command writes into the tree: `> file`, `--json`, `--plot`."""
    out = []
    for block in shell_blocks():
        if block.marker and "docs/bench" in block.marker:  # the documented refresh of docs/ figures
            continue
        for command in block.commands():
            words = shlex.split(command, comments=True)
            for i, word in enumerate(words[:-1]):
                if word in (">", "--json", "--plot") and not words[i + 1].startswith(("/", "-")):
                    out.append((block.where, words[i + 1]))
    return out


def test_what_documented_commands_write_is_ignored_by_git():
    written = written_files()
    assert written, "no documented command writes a file: the finder is broken"
    tracked = [(where, p) for where, p in written
               if subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT).returncode != 0]
    assert tracked == [], f"documented commands write files git would pick up; add them to .gitignore: {tracked}"


def test_make_bench_writes_only_to_an_ignored_folder_and_bench_docs_is_what_refreshes_docs():
    dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", "bench"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    outputs = re.findall(r"--(?:json|plot) (\S+)", dry)
    assert outputs and not any(o.startswith("docs/") for o in outputs), dry
    for o in outputs:
        assert subprocess.run(["git", "check-ignore", "-q", o], cwd=ROOT).returncode == 0, o
    refresh = subprocess.run(["make", "-n", "bench-docs"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "docs/bench/" in refresh
    assert "make bench-docs" in (ROOT / "docs" / "benchmarks.md").read_text()
