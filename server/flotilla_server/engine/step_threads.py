"""How many CPU threads a step's forward pass runs on: for a step of few rows, the count that measured
faster lately (the engine's own, or every core); for every other step, the engine's own.

Why: a decode step of a few rows reads every weight once and does little arithmetic per byte, so its time
is the memory read rate, and one core reads only part of a machine's memory bandwidth. Measured on the
2-core development machine (Intel Xeon, docs/benchmarks.md, "Single-stream speed"): a sum over 400 MB read
9.5 GB/s on one core and 17.7 GB/s on both, and llama-100m's 64 one-row matrix products took 39 ms on one
thread and 24 ms on two. The server leaves a core to the HTTP loop (cli.py: OMP_NUM_THREADS is the cores
less one), which a large batch needs for its streams; a step of at most `SMALL_STEP_MAX_ROWS` rows serves
as many streams, which leave the loop little to do, so such a step may borrow that core.

Why measured and not fixed: a second thread pays only when its core is free. Both threads of an OpenMP
region must finish before the next matrix starts, so a core taken by a neighbour (another process, a
hypervisor stealing the virtual CPU: 22 CPU-seconds in one 150 s benchmark here) stalls every matrix of
the step, and two threads then ran 1.3-3x slower than one. Small models may gain nothing either: tiny's
matrices fit in cache, and its one-row step ran 0.2-1.2x as fast on two threads. So each row count keeps a moving average of its step
time per thread count, runs the faster, and now and then tries the other: after `EXPLORE_MIN_STEPS` steps,
then, each time the trial leaves the faster count as it was, after twice as many, up to
`EXPLORE_MAX_STEPS`. A lasting loss costs at most `TRIAL_STEPS` slow steps in `EXPLORE_MAX_STEPS`, and a
core freed again is found within that many steps (a few seconds of decoding).

Rules:
- a step of more than `SMALL_STEP_MAX_ROWS` rows, or on a runner whose `wide` count is not above its own,
  runs on the engine's own count;
- a step on a different count from the step before is not measured: it pays for waking the other count's
  threads (OpenMP's helpers asleep, or on this virtual machine their idle virtual CPU descheduled);
- per row count (1 to `SMALL_STEP_MAX_ROWS`): a thread count never measured is tried first (the own count,
  then `wide`); after that a step runs the count with the lower average (a tie keeps the own count, which
  leaves the HTTP core free), except a trial every `interval` steps, `TRIAL_STEPS` steps on the other count;
- the seconds of a trial's last step replace its count's average (an average as old as the last trial says
  nothing of the core now); a trial after which the faster count is still the same doubles `interval` (at most
  `EXPLORE_MAX_STEPS`), one that changes it sets `interval` back to `EXPLORE_MIN_STEPS`;
- every other step moves its count's average by `EWMA_WEIGHT` toward the step's seconds; when that makes
  the other count the faster (the core was taken), `interval` goes back to `EXPLORE_MIN_STEPS` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flotilla_contract.flags import SMALL_STEP_MAX_ROWS

from flotilla_server.engine.cpu_quota import usable_cpus

EXPLORE_MIN_STEPS = 16
EXPLORE_MAX_STEPS = 256
TRIAL_STEPS = 2  # the first wakes the other count's threads (measured: up to 3x a warm step), the last is timed
EWMA_WEIGHT = 0.5  # a freed or a taken core shows within two or three steps of one count


def moving_average(previous_s: float | None, sample_s: float) -> float:
    return sample_s if previous_s is None else previous_s + EWMA_WEIGHT * (sample_s - previous_s)


def faster_threads(mean_s: dict[int, float], own: int, wide: int) -> int | None:
    """The count with the lower average (a tie: the own count); None until both are measured."""
    if own not in mean_s or wide not in mean_s:
        return None
    return wide if mean_s[wide] < mean_s[own] else own


def next_interval(interval: int, faster_before: int | None, faster_after: int | None) -> int:
    """The steps until the next trial, after a trial that left the faster count `faster_after`."""
    if faster_before is None or faster_before != faster_after:
        return EXPLORE_MIN_STEPS
    return min(2 * interval, EXPLORE_MAX_STEPS)


@dataclass
class _RowCount:
    mean_s: dict[int, float] = field(default_factory=dict)  # threads -> moving average of step seconds
    interval: int = EXPLORE_MIN_STEPS
    steps_to_trial: int = EXPLORE_MIN_STEPS
    trial_steps_left: int = 0  # > 0 while a trial runs
    trial_from: int | None = None  # the faster count when the running trial began


@dataclass
class SmallStepThreads:
    """Chooses the thread count of each step and learns from its time; one `_RowCount` per row count."""

    own: int
    wide: int
    _rows: dict[int, _RowCount] = field(default_factory=dict)
    _last_threads: int | None = None  # the count of the step before, whatever its rows

    def _state(self, rows: int) -> _RowCount | None:
        if not 0 < rows <= SMALL_STEP_MAX_ROWS or self.wide <= self.own:
            return None
        return self._rows.setdefault(rows, _RowCount())

    def choose(self, rows: int) -> int:
        state = self._state(rows)
        if state is None:
            return self.own
        for threads in (self.own, self.wide):
            if threads not in state.mean_s:
                return threads
        faster = faster_threads(state.mean_s, self.own, self.wide)
        other = self.wide if faster == self.own else self.own
        if state.trial_steps_left:
            return other
        state.steps_to_trial -= 1
        if state.steps_to_trial > 0:
            return faster
        state.trial_steps_left, state.trial_from = TRIAL_STEPS, faster
        return other

    def observe(self, rows: int, threads: int, seconds: float) -> None:
        switched, self._last_threads = threads != self._last_threads, threads
        state = self._state(rows)
        if state is None:
            return
        if state.trial_steps_left:
            state.trial_steps_left -= 1
            if state.trial_steps_left == 0:  # the other count's average is as old as the last trial
                state.mean_s[threads] = seconds
                state.interval = next_interval(state.interval, state.trial_from,
                                               faster_threads(state.mean_s, self.own, self.wide))
                state.steps_to_trial = state.interval
            return
        if switched:
            return
        faster_before = faster_threads(state.mean_s, self.own, self.wide)
        state.mean_s[threads] = moving_average(state.mean_s.get(threads), seconds)
        if faster_before is not None and faster_threads(state.mean_s, self.own, self.wide) != faster_before:
            state.interval = EXPLORE_MIN_STEPS  # what changed may change back: look again soon
            state.steps_to_trial = min(state.steps_to_trial, EXPLORE_MIN_STEPS)

    def mean_s(self, rows: int) -> dict[int, float]:
        state = self._rows.get(rows)
        return dict(state.mean_s) if state else {}


def default_small_step_threads(device: str) -> int:
    """Every CPU this process may use (its cores, capped by its container's CPU quota), for CPU steps; 0 (the
    rule off) on CUDA."""
    return usable_cpus() if device == "cpu" else 0
