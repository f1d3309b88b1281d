"""Which models a multi-model server may load: `--model NAME=SOURCE` flags and a model list file.

A pool's membership arrives as a mounted ConfigMap file, which the kubelet rewrites in place when a member
joins or leaves, so the file is re-read whenever it changes and adding a member restarts nothing
(docs/serving.md, "Multi-model mode"). Parsing is pure and strict (flotilla_contract.model_list, the grammar
the operator writes); `ModelListFile` only reads and compares stamps.

A LoRA adapter line (`NAME=SOURCE base=BASE`) is no model of its own: `fold` hangs it on its base's spec, so
the cache loads, accounts and evicts the base with its adapters, and an adapter's request acquires its base
(docs/serving.md, "LoRA adapters").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flotilla_contract.changed_file import ChangedFile
from flotilla_contract.model_list import ListEntry, parse_entry, parse_model_list


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what clients send as `model`
    source: str  # 'tiny', a Hugging Face directory or a .gguf file
    quantization: str | None = None  # how its weights are held; None: the server's --quantization
    base: str | None = None  # an adapter line's model; `fold` moves it into that model's `adapters`
    adapters: tuple[tuple[str, str], ...] = ()  # a model's LoRA adapters, (name, PEFT directory), in list order

    @property
    def weights(self) -> tuple[str, str | None]:
        """What a load reads: a spec that changes only its adapters changes no weights (no reload)."""
        return self.source, self.quantization


def _spec(entry: ListEntry) -> ModelSpec:
    return ModelSpec(entry.name, entry.source, entry.quantization, entry.base)


def fold(specs: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
    """The models, each with its adapters (the adapter specs whose base it is), in order; ValueError for an
    adapter whose base is not a model here (the file's own lines are checked by the contract, naming the line;
    this is for adapters and bases given apart, by --model flags and the file)."""
    models = {s.name: s for s in specs if s.base is None}
    adapters: dict[str, list[tuple[str, str]]] = {name: [] for name in models}
    for spec in specs:
        if spec.base is None:
            continue
        if spec.base not in models:
            kind = "an adapter" if any(s.name == spec.base for s in specs) else "not a model given"
            raise ValueError(f"adapter {spec.name!r} names base {spec.base!r}, which is {kind}: base= names a model "
                             "given by --model or the model list file")
        adapters[spec.base].append((spec.name, spec.source))
    return tuple(replace(m, adapters=m.adapters + tuple(adapters[m.name])) for m in models.values())


def parse_spec(text: str, where: str = "--model") -> ModelSpec:
    """A `--model NAME=SOURCE` flag → ModelSpec (SOURCE may be relative, as in single-model mode); raises
    ValueError saying what to write instead."""
    return _spec(parse_entry(text, where, relative_ok=True))


def parse_list(text: str, where: str) -> tuple[ModelSpec, ...]:
    """A model list file, strictly (flotilla_contract.model_list): a bad line refuses the whole file. Adapter
    lines stay specs of their own (with `base`) until `fold`."""
    return merge([_spec(entry) for entry in parse_model_list(text, where)])


def merge(*groups: list[ModelSpec] | tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
    """Join lists of specs; a name given twice must name the same source (and quantization)."""
    by_name: dict[str, ModelSpec] = {}
    for group in groups:
        for spec in group:
            seen = by_name.setdefault(spec.name, spec)
            if seen != spec:
                raise ValueError(f"model {spec.name!r} is given twice, as {_said(seen)!r} and {_said(spec)!r}: "
                                 "give each name once")
    return tuple(by_name.values())


def _said(spec: ModelSpec) -> str:
    return ListEntry(spec.name, spec.source, spec.quantization, spec.base).line().partition("=")[2]


class ModelListFile:
    """A model list file, re-read when it changes (flotilla_contract.changed_file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = ChangedFile(path)

    def read_if_changed(self) -> tuple[ModelSpec, ...] | None:
        """The file's specs if it changed since the last call (always on the first), else None.
        Raises OSError or ValueError when it cannot be read or parsed; a version refused once is not read
        again until it changes."""
        text = self._file.read_if_changed()
        return None if text is None else parse_list(text, self.path)
