"""Which models a multi-model server may load: `--model NAME=SOURCE` flags and a model list file.

A pool's membership arrives as a mounted ConfigMap file, which the kubelet rewrites in place when a member
joins or leaves, so the file is re-read whenever it changes and adding a member restarts nothing
(docs/serving.md, "Multi-model mode"). Parsing is pure; `ModelListFile` only reads and compares stamps.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# A served name is what clients send as `model`: no spaces, no '=', nothing a URL or a label would mangle.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what clients send as `model`
    source: str  # a Hugging Face directory, or "tiny"


def parse_spec(text: str, where: str = "--model") -> ModelSpec:
    """`NAME=SOURCE` → ModelSpec; raises ValueError saying what to write instead."""
    name, sep, source = text.strip().partition("=")
    name, source = name.strip(), source.strip()
    if not sep or not source:
        raise ValueError(f"{where}: {text!r} is not NAME=SOURCE; write e.g. tiny=tiny or llama=/models/llama")
    if not _NAME.match(name):
        raise ValueError(f"{where}: model name {name!r} must start with a letter or digit and hold only "
                         "letters, digits and . _ : / - (at most 128)")
    return ModelSpec(name, source)


def parse_list(text: str, where: str) -> tuple[ModelSpec, ...]:
    """One NAME=SOURCE per line; blank lines and lines starting with '#' are skipped."""
    specs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            specs.append(parse_spec(line, f"{where} line {number}"))
    return merge(specs)


def merge(*groups: list[ModelSpec] | tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
    """Join lists of specs; a name given twice must name the same source."""
    by_name: dict[str, ModelSpec] = {}
    for group in groups:
        for spec in group:
            seen = by_name.setdefault(spec.name, spec)
            if seen.source != spec.source:
                raise ValueError(f"model {spec.name!r} is given twice, as {seen.source!r} and {spec.source!r}: "
                                 "give each name once")
    return tuple(by_name.values())


class ModelListFile:
    """A model list file, re-read when its modification time, size or inode changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None

    def read_if_changed(self) -> tuple[ModelSpec, ...] | None:
        """The file's specs if it changed since the last call (always on the first), else None.
        Raises OSError or ValueError when it cannot be read or parsed."""
        st = os.stat(self.path)  # follows the ConfigMap's ..data symlink, so a swapped directory shows
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return None
        with open(self.path, encoding="utf-8") as fh:
            specs = parse_list(fh.read(), self.path)
        self._stamp = stamp
        return specs
