"""What the docs say, read the way a newcomer reads them: the shell blocks, the code spans, the paths.

The docs are found by glob (README.md, docs/**/*.md, examples/*, deploy/*.yaml and the chart's NOTES.txt), so a
page someone adds tomorrow is checked the day it lands.

A shell block is a fenced block tagged sh, bash, shell or console (or untagged whose first line runs a command),
and in a YAML file an indented run of comment lines (`#   kubectl apply …`). A block the tests cannot run here
carries a marker on the line before it, naming why:

    <!-- docs-test: needs a cluster -->          (Markdown)
    # docs-test: needs a cluster                 (a YAML comment)

or naming the test that runs it instead (`docs-test: run by tests/docs/test_operator_quick_start.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_TAGS = {"sh", "bash", "shell", "console"}
COMMAND_WORDS = ("make", "flotilla-", ".venv/", "kubectl", "helm", "curl", "docker", "scripts/", "export", "hf ")
MARKER = re.compile(r"docs-test:\s*(.+?)\s*(?:-->)?\s*$")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the block's first command line
    text: str
    marker: str | None  # what follows `docs-test:` on the line before, if anything

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[str]:
        """The commands, continuation lines joined; in a console block with `$ ` prompts, only those lines."""
        lines = self.text.replace("\\\n", " ").splitlines()
        if any(line.startswith("$ ") for line in lines):
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def doc_files() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [*docs, *sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file()), *sorted((ROOT / "deploy").glob("*.yaml")),
            ROOT / "charts" / "flotilla" / "templates" / "NOTES.txt"]


def markdown_files() -> list[Path]:
    return [p for p in doc_files() if p.suffix == ".md"]


def _marker(lines: list[str], index: int) -> str | None:
    """The marker on the nearest non-blank line before `index`, if that line is one."""
    for line in reversed(lines[:index]):
        if line.strip():
            found = MARKER.search(line)
            return found.group(1) if found else None
    return None


def _markdown_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = re.match(r"^(\s*)```(\S*)", lines[i])
        if not opened:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        indent = len(opened.group(1))
        body = "\n".join(line[indent:] for line in lines[i + 1:end])
        tag = opened.group(2)
        if tag in SHELL_TAGS or (not tag and body.lstrip().startswith(COMMAND_WORDS)):
            blocks.append(Block(path, i + 2, body, _marker(lines, i)))
        i = end + 1
    return blocks


def _comment_blocks(path: Path) -> list[Block]:
    """In a YAML file, runs of `#   command` lines (a comment indented by three or more spaces)."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if re.match(r"^#\s{3,}\S", lines[i]) and lines[i].lstrip("# ").startswith(COMMAND_WORDS):
            start = i
            while i < len(lines) and re.match(r"^#\s{3,}\S", lines[i]):
                i += 1
            body = "\n".join(line[1:].strip() for line in lines[start:i])
            blocks.append(Block(path, start + 1, body, _marker(lines, start)))
        else:
            i += 1
    return blocks


def shell_blocks() -> list[Block]:
    blocks = []
    for path in doc_files():
        blocks += _markdown_blocks(path) if path.suffix == ".md" else _comment_blocks(path)
    return blocks


def code_spans(path: Path) -> list[str]:
    """Every fenced block and every `inline` span of a doc (for a YAML file: every comment line)."""
    text = path.read_text()
    if path.suffix != ".md":
        return [line for line in text.splitlines() if line.lstrip().startswith("#")]
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return fenced + inline
