"""The engine's own CPU thread count, measured once at start-up on the model it serves (policy, torch-free).

Why: one OpenMP thread per core but one (engine/openmp_env.py) is what a model with large matrices needs,
and what a small model on many cores cannot use: every operator of a step waits at a barrier for all its
threads, and a small matrix split 15 ways costs more in waiting than it saves. Measured on a 16-core machine
(docs/benchmarks.md, "Engine modes"), 64 clients streaming from `tiny` got 2,839 tokens/s on 15 threads for
14.6 CPU-seconds, and 3,863 tokens/s on 4 threads for 3.2; one run of three on 15 threads fell to 663. The
count that pays depends on the model and the machine, so the engine times it: a decode step of
`max_num_seqs` rows, the step a loaded server runs, on the default count and on halves of it.

Rules:
- measured only on CPU, for the engine of one model whose count nobody set (OMP_NUM_THREADS in the
  environment, a multi-model server's shares), and only when the default count is at least 2;
- candidates: the default count, then halved, rounded down, to 1;
- a candidate's time is the least of `TIMED_STEPS` steps, after one untimed step that wakes its threads;
- measuring stops at the first candidate more than `TOLERANCE` slower than the fastest so far: halving
  the threads of a model that needed them only slows it further;
- the count kept is the fewest threads within `TOLERANCE` of the fastest: a core the step does not need
  serves HTTP and the neighbours instead;
- steps of few rows still try every usable core against the count kept (engine/step_threads.py).
"""

from __future__ import annotations

from collections.abc import Callable

TOLERANCE = 0.05
TIMED_STEPS = 3


def candidate_counts(own: int) -> list[int]:
    """The default count, then halves of it, down to 1."""
    counts = []
    while own >= 1:
        counts.append(own)
        own //= 2
    return counts


def pick_count(step_s: dict[int, float]) -> int:
    """The fewest threads whose step time is within TOLERANCE of the fastest."""
    fastest_s = min(step_s.values())
    return min(threads for threads, seconds in step_s.items() if seconds <= fastest_s * (1 + TOLERANCE))


def measure_count(own: int, run_step: Callable[[int], float]) -> tuple[int, dict[int, float]]:
    """The count to keep, and each measured count's step seconds; `run_step(threads)` runs one step on that
    many threads and returns its seconds."""
    step_s: dict[int, float] = {}
    for threads in candidate_counts(own):
        run_step(threads)  # wakes (or starts) this count's threads
        step_s[threads] = min(run_step(threads) for _ in range(TIMED_STEPS))
        if step_s[threads] > min(step_s.values()) * (1 + TOLERANCE):
            break
    return pick_count(step_s), step_s


def describe(rows: int, step_s: dict[int, float], kept: int) -> str:
    times = ", ".join(f"{seconds * 1000:.1f} ms on {threads}" for threads, seconds in step_s.items())
    return (f"engine threads: a decode step of {rows} rows took {times}; the engine runs on {kept} "
            f"(OMP_NUM_THREADS sets the count instead)")
