"""Which models a multi-model server lists: its `--model` flags and its model list file, followed as the file
changes, with what it refused and why.

Why apart from the cache: a pool's list is written by someone else (the operator, from InferenceModels), so
it can be wrong in two ways that must not cost the models already served: the file as a whole (a bad line,
an unreadable file) or one entry (a path missing on the volume, a GGUF of an unknown type). Both are kept
here, shown in the load report and the metrics (docs/serving.md, "The model list file").

Rules:
- at start the file must read and parse, and every source must be readable: else the server does not start
  (the CLI exits 2 with one line naming each); with `skip_unreadable_at_start` (a pool's pods, which the
  operator starts with `--unreadable-model-at-start skip`) a listed entry is skipped as on a reload, but at
  least one listed entry must read, when there are any: a server never starts serving nothing because
  every source failed;
- on a reload, a file that cannot be read or parsed is refused whole: the list before stays in force, the
  failure is logged and counted once per version of the file, and shown until a good version is read;
- on a reload, an entry whose source cannot be read is skipped, logged once and shown, while the others
  serve (at start too, for a pool's pods: they keep serving every other member); it is tried again every SKIPPED_RETRY_S, so a model
  copied onto the volume after its entry was written is served without touching the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from flotilla_server.model_cache.specs import ModelListFile, ModelSpec, fold, merge

log = logging.getLogger("flotilla.model_cache")

LIST_POLL_S = 1.0  # how often the model list file is checked for changes
SKIPPED_RETRY_S = 10.0  # how often entries whose source could not be read are tried again


@dataclass(frozen=True)
class Skipped:
    """A listed model that is not served: its source cannot be read."""

    name: str
    source: str
    error: str


@dataclass(frozen=True)
class ListStatus:
    """What the load report and the metrics show of the list file."""

    path: str
    reload_failures: int  # versions of the file refused since start
    last_error: str | None  # why the latest version was refused; None once a good one was read
    skipped: tuple[Skipped, ...]


class Membership:
    def __init__(self, flag_specs: tuple[ModelSpec, ...], list_path: str | None,
                 skip_unreadable_at_start: bool = False) -> None:
        """Reads the list file now; ValueError, in one line, if it cannot be read or parsed."""
        self.flag_specs = flag_specs
        self.skip_unreadable_at_start = skip_unreadable_at_start
        self._list = ModelListFile(list_path) if list_path else None
        self.reload_failures = 0
        self.last_error: str | None = None
        self.skipped: dict[str, Skipped] = {}
        self._checked_s = float("-inf")
        self._retry_s = float("-inf")
        # in force: the flags and the last good list, adapters folded onto their bases (a flag's adapter may
        # name a base the file lists: folded once the file is read)
        self.specs = fold(flag_specs) if self._list is None else flag_specs
        if self._list is not None:
            try:
                self.specs = fold(merge(flag_specs, self._list.read_if_changed() or ()))
            except OSError as e:
                raise ValueError(f"--model-list-file {self._list.path} cannot be read ({e.strerror or e}); give "
                                 "the path of a file of NAME=SOURCE lines") from None

    def check_start(self, skipped: list[Skipped]) -> None:
        """At start, with the entries whose source could not be read: ValueError (one line) naming them; with
        `skip_unreadable_at_start`, only for a flag's or when nothing listed is left, and the rest are recorded
        as on a reload."""
        flags = {s.name for s in self.flag_specs}
        bad = [s for s in skipped if s.name in flags or not self.skip_unreadable_at_start]
        if not bad and skipped and len(skipped) == len(self.specs):
            bad = skipped
        if bad:
            where = "; ".join(f"model {s.name} ({s.source}): {s.error}" if s.name in flags
                              else f"--model-list-file's model {s.name} ({s.source}): {s.error}" for s in bad)
            raise ValueError(where if len(bad) < len(self.specs) else f"no model can be served: {where}")
        self.record_skipped(skipped)

    def poll(self, now_s: float, force: bool = False) -> tuple[ModelSpec, ...] | None:
        """The specs to apply now: the new list when the file changed and parsed, or the list in force when
        skipped entries are due another try; None: nothing to do. `force`: check the file now (tests)."""
        if self._list is None or (not force and now_s - self._checked_s < LIST_POLL_S):
            return None
        self._checked_s = now_s
        specs = None
        try:
            listed = self._list.read_if_changed()
            if listed is not None:
                specs = self.specs = fold(merge(self.flag_specs, listed))
                self.last_error = None
                log.info("model list %s: %s", self._list.path, ", ".join(s.name for s in listed) or "(empty)")
        except (OSError, ValueError) as e:
            self._refuse(f"cannot be read ({e.strerror or e})" if isinstance(e, OSError) else str(e))
        if specs is None and self.skipped and now_s >= self._retry_s:
            specs = self.specs
        if specs is not None:
            self._retry_s = now_s + SKIPPED_RETRY_S
        return specs

    def _refuse(self, error: str) -> None:
        if error == self.last_error:
            return  # the same failure again (a file still missing): counted once
        self.last_error = error
        self.reload_failures += 1
        log.error("model list %s refused, the models listed before stay: %s", self._list.path, error)  # type: ignore[union-attr]

    def record_skipped(self, skipped: list[Skipped]) -> None:
        now = {s.name: s for s in skipped}
        for s in skipped:
            if self.skipped.get(s.name) != s:
                log.error("model %s is not served: %s", s.name, s.error)
        for name in self.skipped.keys() - now.keys():
            log.info("model %s is no longer skipped (its source reads, or it left the list)", name)
        self.skipped = now

    def status(self) -> ListStatus | None:
        if self._list is None:
            return None
        return ListStatus(self._list.path, self.reload_failures, self.last_error,
                          tuple(sorted(self.skipped.values(), key=lambda s: s.name)))
