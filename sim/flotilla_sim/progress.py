"""A progress bar on stderr for long runs: a fleet day of every policy takes minutes.

It draws only on a terminal (or when forced), so tests and CI logs stay clean.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "", stream=None, force: bool = False, width: int = 40) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self.width = width
        self.done = 0
        self.started = time.monotonic()
        self._drawn_at = -1.0

    def advance(self, steps: int = 1) -> None:
        self.done += steps
        now = time.monotonic()
        if self.enabled and (now - self._drawn_at >= 0.2 or self.done >= self.total):
            self._drawn_at = now
            share = min(self.done / self.total, 1.0)
            filled = int(share * self.width)
            elapsed = now - self.started
            eta = elapsed / share - elapsed if share > 0 else 0.0
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                              f"{share:6.1%} {elapsed:5.0f}s elapsed, ~{eta:4.0f}s left")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()
