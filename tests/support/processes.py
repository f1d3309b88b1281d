"""The processes a test started and the memory they hold, read from /proc: a server's engine processes, its
forkserver and what it forked."""

from __future__ import annotations

import contextlib
from pathlib import Path


def descendants(root: int) -> list[int]:
    """`root` and every process below it (the engine process, the forkserver and what it forked)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def pss_bytes(root: int, *, include_root: bool = True) -> int:
    """The summed proportional set size of `root`'s processes (shared pages split among their sharers)."""
    total = 0
    for pid in descendants(root)[0 if include_root else 1:]:
        with contextlib.suppress(OSError):  # a process that ended meanwhile holds nothing
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total
