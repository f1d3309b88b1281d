"""The LoRA list file (`--lora-list-file`): one `NAME=SOURCE` adapter a line, read at start and followed as it
changes, so that adapters are added and removed without a restart (docs/serving.md, "LoRA adapters").

Why a file: the operator (or anyone) keeps a pod's adapters in one mounted ConfigMap, as a pool keeps its
models in the model list file; the engine process reads it, beside the adapters it serves, so one engine
serving several HTTP processes reads it once. Parsing and the change plan are pure; `LoraListFile` only
reads and compares stamps, as model_cache/specs.py's ModelListFile does.

Rules:
- a line is blank, a comment (`#` first, after any indent), or NAME=SOURCE with optional spaces around each:
  NAME as a model's (flotilla_contract.model_list.name_problem), SOURCE the absolute path of a PEFT adapter
  directory, without whitespace or control characters; nothing else on the line;
- a name given twice: the later line is refused;
- at start every refused line refuses the start (exit 2, one line naming the file, the line and why);
  on a re-read a refused line is logged once and skipped, and the others apply;
- the file is checked every LIST_POLL_S (its modification time, size and inode, as the model list file);
  lines whose adapter failed to load are tried again every RETRY_S while the file is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flotilla_contract.changed_file import ChangedFile
from flotilla_contract.model_list import name_problem

LIST_POLL_S = 1.0  # how often the file's stamp is checked (model_cache/membership.py's LIST_POLL_S)
RETRY_S = 10.0  # how often listed adapters that failed to load are tried again (its SKIPPED_RETRY_S)


@dataclass(frozen=True)
class ListedAdapters:
    """What one version of the file lists: the adapters by name, in order, and each refused line's reason."""

    entries: dict[str, str] = field(default_factory=dict)  # name -> source
    problems: tuple[str, ...] = ()
    problem_names: tuple[str, ...] = ()  # each refused line's NAME, as written ('' when it gives none)


def parse_lora_list(text: str, where: str) -> ListedAdapters:
    """Every line of the file, each refused line apart (its message names `where` and the line number)."""
    entries: dict[str, str] = {}
    problems: list[str] = []
    names: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        at = f"{where} line {number}"
        name, sep, source = (part.strip() for part in line.partition("="))
        problem = _line_problem(name, sep, source) or (
            f"adapter {name!r} is listed twice: give each name once" if name in entries else None)
        if problem is not None:
            problems.append(f"{at}: {problem}")
            names.append(name)
        else:
            entries[name] = source
    return ListedAdapters(entries, tuple(problems), tuple(names))


def _line_problem(name: str, sep: str, source: str) -> str | None:
    if not sep or not name or not source:
        return "a line is NAME=SOURCE (both required), e.g. legal=/adapters/legal"
    if not source.startswith("/") or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in source):
        return (f"source {source!r} is not an absolute path without whitespace: give the PEFT adapter directory's "
                "path, from / (a comment goes on a line of its own)")
    return name_problem(name)


@dataclass(frozen=True)
class ListChanges:
    unloads: tuple[str, ...] = ()  # names the list loaded that it no longer lists as they are
    loads: tuple[tuple[str, str], ...] = ()  # (name, source) listed and not served from that source by the list


def plan_changes(owned: Mapping[str, str], listed: Mapping[str, str]) -> ListChanges:
    """What makes the adapters the list loaded (`owned`, name -> source) follow the file (`listed`): a removed
    line's adapter is unloaded, an added line's loaded, a line whose source changed both, in that order."""
    unloads = tuple(name for name, source in owned.items() if listed.get(name) != source)
    loads = tuple((name, source) for name, source in listed.items() if owned.get(name) != source)
    return ListChanges(unloads, loads)


class LoraListFile:
    """The file, re-read when it changes (flotilla_contract.changed_file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = ChangedFile(path)

    def read_if_changed(self) -> ListedAdapters | None:
        """The file's adapters if it changed since the last call (always on the first), else None; OSError
        when it cannot be read (a version that failed is read again only once it changes)."""
        text = self._file.read_if_changed()
        return None if text is None else parse_lora_list(text, f"--lora-list-file {self.path}")


def read_at_start(path: str | None, flag_names: tuple[str, ...]) -> tuple[LoraListFile | None, dict[str, str]]:
    """The file and its adapters at start; ValueError (one line) for an unreadable file, a refused line, or a
    name a --lora flag already serves."""
    if path is None:
        return None, {}
    file = LoraListFile(path)
    try:
        listed = file.read_if_changed()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--lora-list-file {path} cannot be read ({getattr(e, 'strerror', None) or e}); give "
                         "the path of a file of NAME=SOURCE lines") from None
    assert listed is not None  # the first read always reads
    if listed.problems:
        raise ValueError(listed.problems[0])
    taken = [name for name in listed.entries if name in flag_names]
    if taken:
        raise ValueError(f"--lora-list-file {path} lists the adapter {taken[0]!r}, which --lora already serves: "
                         "give each adapter once")
    return file, dict(listed.entries)
