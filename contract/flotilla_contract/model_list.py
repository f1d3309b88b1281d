"""The model list file of a multi-model server: one `NAME=SOURCE` entry a line, written by the operator (a
ModelPool's members ConfigMap) and read by the server (`--model-list-file`).

One grammar, here, for both sides: the operator writes only entries this module accepts, and the server
refuses a whole file that breaks it, so a file can never mean more than its writer meant (docs/serving.md,
"The model list file"). Pure and standard-library only.

Rules:
- a line is blank, a comment (`#` first, after any indent), or exactly one entry: NAME, `=`, SOURCE, with
  optional spaces around each, then optionally ` quantization=VALUE` (one of flags.QUANTIZATIONS: how that
  model's weights are held, over the server's `--quantization`); any other field is refused, never ignored;
- NAME is what clients send as `model`: a letter or digit, then letters, digits and `. _ : / -`, 128 at most;
- SOURCE is `tiny` (the built-in model) or an absolute path (a Hugging Face directory or a `.gguf` file),
  without whitespace or control characters; `--model NAME=SOURCE` also takes a relative path, as single-model
  mode does, but a file is read by a server whose working directory its writer does not know;
- no field has a default: a line without `=` or with an empty NAME or SOURCE is refused, never read as
  NAME=NAME or as `tiny`; an empty file lists no model (a pool without members), never a default one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flotilla_contract.flags import QUANTIZATIONS

BUILTIN_SOURCES = ("tiny",)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
_NAME = re.compile(NAME_PATTERN)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")
_EXAMPLE = "write e.g. tiny=tiny or llama=/models/llama"


def name_problem(name: str) -> str | None:
    """What is wrong with a served name, or None."""
    if _NAME.fullmatch(name):  # not match: its $ also matches before a final newline
        return None
    return (f"model name {name!r} must start with a letter or digit and hold only letters, digits and "
            ". _ : / - (at most 128)")


def source_problem(source: str, *, relative_ok: bool = False) -> str | None:
    """What is wrong with a SOURCE, or None. `relative_ok`: a `--model` flag's, not a file's."""
    if not source:
        return f"the source is empty; {_EXAMPLE}"
    if _UNPRINTABLE.search(source):
        return f"source {source!r} holds a control character; give the model's path"
    if source != source.strip():
        return f"source {source!r} begins or ends with whitespace; give the path without it"
    if any(c.isspace() for c in source):
        first, extra = source.split(None, 1)
        return (f"{extra!r} follows source {first!r}: an entry is NAME=SOURCE, then at most quantization=VALUE, "
                "and a source has no whitespace (a comment goes on a line of its own)")
    if source in BUILTIN_SOURCES or source.startswith("/") or relative_ok:
        return None
    return (f"source {source!r} is neither {' nor '.join(repr(s) for s in BUILTIN_SOURCES)} nor an absolute path; "
            "give the path of a Hugging Face model directory or of a .gguf file, from /")


def quantization_problem(quantization: str | None) -> str | None:
    if quantization is None or quantization in QUANTIZATIONS:
        return None
    return f"quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}"


def entry_problem(name: str, source: str, quantization: str | None = None) -> str | None:
    """What keeps an entry from being a line of a model list file, or None: what the writer checks."""
    return name_problem(name) or source_problem(source) or quantization_problem(quantization)


@dataclass(frozen=True)
class ListEntry:
    name: str  # what clients send as `model`
    source: str  # 'tiny', a Hugging Face directory or a .gguf file
    quantization: str | None = None  # None: the server's --quantization

    def line(self) -> str:
        return f"{self.name}={self.source}" + (f" quantization={self.quantization}" if self.quantization else "")


def parse_entry(text: str, where: str, *, relative_ok: bool = False) -> ListEntry:
    """`NAME=SOURCE [quantization=VALUE]` → ListEntry; ValueError naming `where` and what to write instead."""
    name, sep, rest = text.strip().partition("=")
    name, rest = name.strip(), rest.strip()
    if not sep or not name or not rest:
        raise ValueError(f"{where}: {text.strip()!r} is not NAME=SOURCE (both required); {_EXAMPLE}")
    source, quantization = rest, None
    head, _, tail = rest.rpartition(" ")
    if head and tail.startswith("quantization="):
        source, quantization = head.strip(), tail.removeprefix("quantization=")
    problem = name_problem(name) or source_problem(source, relative_ok=relative_ok) or quantization_problem(quantization)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    return ListEntry(name, source, quantization)


def parse_model_list(text: str, where: str) -> list[ListEntry]:
    """Every entry of a model list file, in order; ValueError naming the first bad line."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            entries.append(parse_entry(line, f"{where} line {number}"))
    return entries


def format_model_list(entries: list[ListEntry]) -> str:
    """The file for `entries`, one line each; ValueError for an entry the server would refuse (a writer checks
    `entry_problem` first)."""
    lines = []
    for entry in entries:
        problem = entry_problem(entry.name, entry.source, entry.quantization)
        if problem is not None:
            raise ValueError(problem)
        lines.append(entry.line() + "\n")
    return "".join(lines)
