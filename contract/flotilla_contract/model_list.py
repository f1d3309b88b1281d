"""The model list file of a multi-model server: one `NAME=SOURCE` entry a line, written by the operator (a
ModelPool's members ConfigMap) and read by the server (`--model-list-file`).

One grammar, here, for both sides: the operator writes only entries this module accepts, and the server
refuses a whole file that breaks it, so a file can never mean more than its writer meant (docs/serving.md,
"The model list file"). Pure and standard-library only.

Rules:
- a line is blank, a comment (`#` first, after any indent), or exactly one entry: NAME, `=`, SOURCE, with
  optional spaces around each, then optional fields, each at most once, in any order: ` quantization=VALUE`
  (one of flags.QUANTIZATIONS: how that model's weights are held, over the server's `--quantization`) and
  ` base=BASE` (the line is a LoRA adapter served on the model BASE); any other field is refused, never ignored;
- an adapter line (`base=`) takes no quantization (its factors follow its base's dtype), its SOURCE is the
  absolute path of a PEFT adapter directory, and its BASE is the NAME of a model line of the same file (not
  an adapter's, not its own);
- a name is given once in a file: a second line with it is refused, an adapter with a model's name too;
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
                "or base=BASE for an adapter, and a source has no whitespace (a comment goes on a line of its own)")
    if source in BUILTIN_SOURCES or source.startswith("/") or relative_ok:
        return None
    return (f"source {source!r} is neither {' nor '.join(repr(s) for s in BUILTIN_SOURCES)} nor an absolute path; "
            "give the path of a Hugging Face model directory or of a .gguf file, from /")


def quantization_problem(quantization: str | None) -> str | None:
    if quantization is None or quantization in QUANTIZATIONS:
        return None
    return f"quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}"


def adapter_problem(name: str, source: str, quantization: str | None, base: str, *,
                    relative_ok: bool = False) -> str | None:
    """What keeps an adapter line's own fields (`base=` given) from being served, or None."""
    if quantization is not None:
        return (f"adapter {name!r} (base={base}) has quantization={quantization}: an adapter's factors follow its "
                "base's dtype; drop quantization= from the adapter's line")
    if base == name:
        return f"adapter {name!r} names itself as its base: base= names a model line of the file"
    if source in BUILTIN_SOURCES or not (source.startswith("/") or relative_ok):
        return (f"adapter {name!r}: source {source!r} is not a PEFT adapter directory's absolute path; give the "
                "directory that holds adapter_config.json and adapter_model.safetensors, from /")
    problem = name_problem(base)
    return None if problem is None else f"base {problem.removeprefix('model ')}"


def entry_problem(name: str, source: str, quantization: str | None = None, base: str | None = None) -> str | None:
    """What keeps an entry from being a line of a model list file, or None: what the writer checks."""
    return (name_problem(name) or source_problem(source) or quantization_problem(quantization)
            or (None if base is None else adapter_problem(name, source, quantization, base)))


@dataclass(frozen=True)
class ListEntry:
    name: str  # what clients send as `model`
    source: str  # 'tiny', a Hugging Face directory or a .gguf file; an adapter's: a PEFT adapter directory
    quantization: str | None = None  # None: the server's --quantization
    base: str | None = None  # an adapter's model (another line's NAME); None: this line is a model

    def line(self) -> str:
        return (f"{self.name}={self.source}" + (f" quantization={self.quantization}" if self.quantization else "")
                + (f" base={self.base}" if self.base else ""))


_FIELDS = ("quantization", "base")


def parse_entry(text: str, where: str, *, relative_ok: bool = False) -> ListEntry:
    """`NAME=SOURCE [quantization=VALUE] [base=BASE]` → ListEntry; ValueError naming `where` and what to write
    instead. Fields are peeled from the line's end, each once: whatever is left must be a source."""
    name, sep, rest = text.strip().partition("=")
    name, rest = name.strip(), rest.strip()
    if not sep or not name or not rest:
        raise ValueError(f"{where}: {text.strip()!r} is not NAME=SOURCE (both required); {_EXAMPLE}")
    fields: dict[str, str] = {}
    while True:
        head, _, tail = rest.rpartition(" ")
        key, eq, value = tail.partition("=")
        if not head.strip() or not eq or key not in _FIELDS or key in fields or not value:
            break
        fields[key], rest = value, head.strip()
    source, quantization, base = rest, fields.get("quantization"), fields.get("base")
    problem = (name_problem(name) or source_problem(source, relative_ok=relative_ok)
               or quantization_problem(quantization)
               or (None if base is None else adapter_problem(name, source, quantization, base, relative_ok=relative_ok)))
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    return ListEntry(name, source, quantization, base)


def list_problem(entries: list[ListEntry], wheres: list[str]) -> str | None:
    """What the lines of one file break together (each entry being good alone), naming the line, or None:
    a name given twice, an adapter whose base is no model line of the file, or is an adapter."""
    first: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.name in first:
            seen = entries[first[entry.name]]
            said = seen.line().partition("=")[2], entry.line().partition("=")[2]
            kinds = {seen.base is None, entry.base is None}
            what = "an adapter has a model's name" if kinds == {True, False} else "give each name once"
            return (f"{wheres[i]}: {entry.name!r} is given twice, as {said[0]!r} and {said[1]!r} (first on "
                    f"{wheres[first[entry.name]]}): {what}")
        first[entry.name] = i
    for i, entry in enumerate(entries):
        if entry.base is None:
            continue
        if entry.base not in first:
            return (f"{wheres[i]}: adapter {entry.name!r} names base {entry.base!r}, which no line lists: base= "
                    "names a model line of the same file")
        base = entries[first[entry.base]]
        if base.base is not None:
            return (f"{wheres[i]}: adapter {entry.name!r} names base {entry.base!r}, which is itself an adapter "
                    f"({wheres[first[entry.base]]}): base= names a model, never an adapter")
    return None


def parse_model_list(text: str, where: str) -> list[ListEntry]:
    """Every entry of a model list file, in order; ValueError naming the first bad line."""
    entries, wheres = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            wheres.append(f"{where} line {number}")
            entries.append(parse_entry(line, wheres[-1]))
    problem = list_problem(entries, wheres)
    if problem is not None:
        raise ValueError(problem)
    return entries


def format_model_list(entries: list[ListEntry]) -> str:
    """The file for `entries`, one line each; ValueError for an entry the server would refuse (a writer checks
    `entry_problem` first) or lines it would refuse together (`list_problem`)."""
    lines = []
    for entry in entries:
        problem = entry_problem(entry.name, entry.source, entry.quantization, entry.base)
        if problem is not None:
            raise ValueError(problem)
        lines.append(entry.line() + "\n")
    problem = list_problem(entries, [f"entry {i + 1}" for i in range(len(entries))])
    if problem is not None:
        raise ValueError(problem)
    return "".join(lines)
