"""CPU time of the processes a benchmark arm runs, read from /proc, so a figure can say who used the cores.

On a machine of two cores the server, its engine process and the load generators share them; a latency
that moves between arms may be the server's policy or only a load generator taking a core. Each arm
records, for its measurement window, the CPU seconds of the server's HTTP process, of its descendants
(the engine process), and of the load generators. Linux only: without /proc every figure reads 0.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process `pid` (all its threads); None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime: fields 14 and 15 of stat


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, children first."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            frontier += kids
    return found


def snapshot(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each named group of processes (a gone process counts nothing)."""
    return {name: sum(s for pid in pids if (s := cpu_s(pid)) is not None) for name, pids in groups.items()}


def cores_used(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Each group's mean cores in use between two snapshots `seconds` apart."""
    if seconds <= 0:
        return {}
    return {name: round((after[name] - before.get(name, 0.0)) / seconds, 3) for name in after}
