"""How many CPU threads each model's engine gets in a multi-model server, and how many models share them.

Each engine is a process with its own OpenMP pool, and torch's default pool is as large as the machine.
Three resident engines of 15 threads on 16 cores are 45 threads: when all three step at once they preempt
one another inside every matmul, and each barrier waits for the slowest. So the threads left to engines
(`OMP_NUM_THREADS`, which flotilla-server sets to the usable CPUs minus one for the event loop) are split
evenly among as many models as the memory budget can hold at once, at least one each. A lone busy model
then runs on its share only: the price of never oversubscribing when they are all busy. A model's load
runs on one thread at a lower priority (engine_processes.py) whatever its share.

Pure and torch-free, so every rule is a table test (docs/serving.md, "Multi-model mode").
"""

from __future__ import annotations

from collections.abc import Iterable


def most_resident(budget_bytes: int, footprints_bytes: Iterable[int]) -> int:
    """The most models that can be loaded at once: the smallest first, while they fit; at least 1."""
    held, count = 0, 0
    for size in sorted(footprints_bytes):
        if held + size > budget_bytes:
            break
        held, count = held + size, count + 1
    return max(1, count)


def engine_threads(cpu_threads: int, models_at_once: int) -> int:
    """Each engine's share of the threads left to engines, at least one."""
    return max(1, cpu_threads // max(1, models_at_once))
