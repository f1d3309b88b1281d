"""How many CPU threads each model's engine gets in a multi-model server, and how many models share them.

Each engine is a process with its own OpenMP pool, and torch's default pool is as large as the machine.
Three resident engines of 15 threads on 16 cores are 45 threads: when all three step at once they preempt
one another inside every matmul, and each barrier waits for the slowest. So the threads left to engines
(`OMP_NUM_THREADS`, which flotilla-server sets to the usable CPUs minus one for the event loop; the usable
CPUs are the cores capped by the container's CPU quota, engine/cpu_quota.py) are split evenly among as many
models as the memory budget can hold at once, at least one each. A lone busy model then runs on its share
only: the price of never oversubscribing when they are all busy. A model's load runs on one thread at a
lower priority (engine_processes.py) whatever its share.

Rules:
- the threads left to engines never exceed the usable CPUs, whatever `OMP_NUM_THREADS` says: a thread beyond
  the quota only waits at the barriers;
- a step of few rows never borrows past the engine's share either (`--small-step-threads`, which lets one
  model's steps take every usable CPU, is capped at the share): three models each stepping one stream on
  two CPUs would otherwise run six threads there.

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


def threads_for_engines(omp_num_threads: str | None, usable_cpus: int) -> int:
    """The threads all engines share: `OMP_NUM_THREADS` if set, capped at the usable CPUs; else those CPUs."""
    wanted = int(omp_num_threads) if omp_num_threads else usable_cpus
    return max(1, min(wanted, usable_cpus))


def small_step_threads(share: int, flag: int | None) -> int:
    """The most threads an engine's step of few rows may take: its share, or less if `--small-step-threads`
    (None: unset) says so; never more. 0 stays 0 (the rule off)."""
    return share if flag is None else min(flag, share)
