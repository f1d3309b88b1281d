"""Which parked models to let go, and whether a parked copy still matches its source: pure decisions.

A parked model (docs/architecture.md, "Parked models") is an evicted model whose engine process kept its
weights outside the memory budget. Parked models have their own bounds, --parked-memory (bytes: the parked
weights plus each parked process's own memory) and --max-parked-models; past either, the least recently
parked go first. A parked copy is used only while its source and its parked file are as they were when it
was parked (size and modification time of every file the loader reads), else the model loads from its source.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# the files a Hugging Face directory's load reads (model/loader.py), whose change makes a parked copy stale
_HF_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json")

Stamp = tuple[tuple[str, int, int], ...]  # (file, size in bytes, mtime in ns) for each file, sorted


@dataclass(frozen=True)
class ParkedCost:
    name: str
    bytes: int  # weights parked plus the parked process's own (anonymous) memory
    parked_at_s: float  # monotonic


def parked_victims(parked: Sequence[ParkedCost], limit_bytes: int, max_models: int,
                   loading: str | None = None) -> list[str]:
    """The parked models to stop, least recently parked first, so that the rest hold at most `limit_bytes`
    and number at most `max_models`; one that alone exceeds the limit goes too. `loading`, the model whose
    load evicts the one just parked, is neither chosen nor counted: it leaves the parked models when it wakes,
    next (until then the bounds are exceeded by it alone)."""
    kept = sorted((p for p in parked if p.name != loading), key=lambda p: p.parked_at_s)
    victims = []
    while kept and (len(kept) > max_models or sum(p.bytes for p in kept) > limit_bytes):
        victims.append(kept.pop(0).name)
    return victims


def file_stamp(path: str | Path) -> Stamp:
    """One file's stamp; () if it cannot be read (a parked file gone: never equal to a recorded stamp)."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return ((str(path), st.st_size, st.st_mtime_ns),)


def source_stamp(source: str) -> Stamp:
    """What a load of `source` reads: the `.gguf` file, or a directory's config, tokenizer and weight files;
    () for the embedded `tiny`, which cannot change."""
    path = Path(source)
    if not path.is_dir():
        return file_stamp(path) if path.exists() else ()
    files = sorted({*(path / n for n in _HF_FILES if (path / n).exists()), *path.glob("*.safetensors")})
    return tuple(s for f in files for s in file_stamp(f))
