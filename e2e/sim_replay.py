"""The e2e side of the simulator's agreement check: measure this run, replay it, compare, print.

A scenario test records its model's autoscaler ticks (`Recorder.ticks`) and measures, in its own run,
the pod start-up delay (creation to serving, from the pod runner), the scrape lag (a change on a server
to Prometheus' first sample of it, from Prometheus' own timestamps) and the mean engine step second
by second (flotilla_step_duration_seconds). `check` then replays the scenario in flotilla-sim at the
same ticks from the InferenceModel's own spec, and returns the agreement (flotilla_sim.agreement) with
both timelines printed. The replay is pure and takes well under a second.
"""

from __future__ import annotations

import math
import re
import time
from itertools import pairwise
from typing import Any

from flotilla_operator import types
from flotilla_operator.handlers.autoscale import scaling_spec
from flotilla_operator.slo_status import slo_targets
from flotilla_sim.agreement import Agreement, compare
from flotilla_sim.replay import E2EScenario, replay

from e2e.harness import Loop, Tick
from e2e.load import LoadReport
from tests.support.prometheus import RealPrometheus

WINDOW_S = 900  # how far back the raw samples are read; a scenario, even on a busy machine, is shorter
STEP_WINDOW_S = 5  # the engine step is averaged over this window (five 1 s scrapes)


def first_sample_s(prometheus: RealPrometheus, selector: str, after_epoch_s: float) -> float | None:
    """The timestamp of the first scrape after `after_epoch_s` where any series of `selector` is above zero."""
    times = [t for _, values in prometheus.samples(selector, WINDOW_S) for t, v in values
             if t >= after_epoch_s and v > 0]
    return min(times, default=None)


def step_times(prometheus: RealPrometheus, model: str, start_epoch_s: float) -> tuple[tuple[float, float], ...]:
    """(seconds from `start_epoch_s`, mean engine step of `model` in the 5 s centred there) every second until
    now; seconds with no step are left out."""
    selector = f'{{namespace="default",model="{model}"}}'
    def rate(part: str) -> str:
        return f"sum(rate(flotilla_step_duration_seconds_{part}{selector}[{STEP_WINDOW_S}s]))"

    series = prometheus.query_range(f"{rate('sum')} / {rate('count')}", start_epoch_s, time.time(), 1.0)
    steps = tuple((t - STEP_WINDOW_S / 2 - start_epoch_s, v) for _, values in series for t, v in values
                  if math.isfinite(v) and v > 0)
    if not steps:
        raise AssertionError(f"no engine steps of {model} in Prometheus")
    return steps


def scenario(model: dict[str, Any], **measured: Any) -> E2EScenario:
    """The simulator's scenario from the InferenceModel object (as the operator parses it) and the measured figures."""
    spec = types.parse_spec(model["spec"])
    return E2EScenario(scaling_spec(spec), spec.server.max_num_seqs, spec.server.queue_depth_per_slot,
                       float(spec.server.queue_timeout_seconds), slo=slo_targets(spec), **measured)


HELD_TICKS = 2  # the agreement's moment tolerance, in intervals


def check(name: str, real_ticks: list[Tick], start_epoch_s: float, sim: E2EScenario, interval_s: float,
          load: LoadReport | None = None) -> Agreement:
    """Replay `sim` at the real ticks (seconds from `start_epoch_s`), compare, and print both timelines
    with the running (R) and waiting (Q) requests each side's autoscaler saw."""
    real = [(tick.epoch_s - start_epoch_s, tick.replicas) for tick in real_ticks]
    # The run ends at its last scale, and the real count holds after it: no load is left, and the operator
    # records no new decision while nothing changes. So the comparison runs HELD_TICKS intervals further at
    # that count, where a simulated scale up to two intervals later than the real one shows (agreement.py).
    last_s, last_count = real[-1]
    real += [(last_s + k * interval_s, last_count) for k in range(1, HELD_TICKS + 1)]
    # The rule's intervals are the real loop's: its ticks come a little more than interval_s apart (the
    # loop's own work), so a moment two ticks later was 4.03 s later at a 2 s interval (make test). The
    # widest spacing of consecutive ticks keeps two ticks within the tolerance; a gap where decisions are
    # missing (over 1.5 intervals) is not a tick's spacing. At least interval_s: the held ticks' spacing.
    tick_s = max(b - a for (a, _), (b, _) in pairwise(real) if b - a < 1.5 * interval_s)
    replayed = replay(sim, [t for t, _ in real])
    agreement = compare(real, replayed.timeline, sim.initial_replicas, tick_s)
    decisions = [_seen(tick.decision) for tick in real_ticks] + ["(held)"] * HELD_TICKS
    notes = [f"real {d:<12} sim R={r:g} Q={q:g}" for d, (r, q) in zip(decisions, replayed.seen, strict=True)]
    served = replayed.requests
    print(f"\n{name}: the real loop against flotilla-sim's replay (measured: start-up {sim.start_up_s:.1f} s, "
          f"scrape lag {sim.scrape_lag_s:.2f} s, engine step {_range_ms(sim.steps_s)}; {sim.clients} clients, "
          f"load stopped at {sim.stop_s:.1f} s)")
    if load is not None:
        print(f"requests: real {load.completed} completed, {load.rejected_429} x 429; simulated "
              f"{served['served']:.0f} completed, {served['rejected_429']:.0f} x 429")
    print(agreement.table(notes))
    return agreement


def check_scale_out(loop: Loop, name: str, ticks: list[Tick], load_epoch_s: float, queue_epoch_s: float,
                    stopped_epoch_s: float, clients: int, max_tokens: int, interval_s: float,
                    load: LoadReport) -> Agreement:
    """`check` of a run that scaled out under a closed-loop load: its start-up measured from the first
    scale-up decision to each new replica's first answer, its scrape lag from the load's start to the queue's
    first sample, and its engine steps from Prometheus."""
    up_decision_s = next(t for t, n, _ in ticks if n > 1)  # the decision; its PATCH follows at once
    starts = [t - up_decision_s for t in loop.runner.ready_epochs[name] if t > up_decision_s]
    assert starts, loop.runner.ready_epochs
    sim = scenario(loop.model(name), start_up_s=sum(starts) / len(starts), scrape_lag_s=queue_epoch_s - load_epoch_s,
                   steps_s=step_times(loop.prometheus, name, load_epoch_s), clients=clients, max_tokens=max_tokens,
                   stop_s=stopped_epoch_s - load_epoch_s)
    return check(name, ticks, load_epoch_s, sim, interval_s, load)


def _range_ms(steps_s: tuple[tuple[float, float], ...]) -> str:
    values = [s * 1e3 for _, s in steps_s]
    return f"{min(values):.0f} to {max(values):.0f} ms" if values else "none (no load)"


def _seen(decision: str) -> str:
    """`R=.. Q=..` out of a lastDecision message."""
    found = re.search(r"R=(\S+) Q=(\S+)", decision)
    return f"R={found[1]} Q={found[2]}" if found else "-"
