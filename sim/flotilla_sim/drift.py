"""A drifting day: the fleet day's traffic (workload.fleet_day) over a catalogue whose popular set moves and
whose tail sleeps, the workload adaptive tiering is for (issue 37, docs/simulation.md, "A drifting day").

Why: in `fleet_day` every model has demand all day in a fixed Zipf order, so a model's best tier never
changes and the pool ends up holding hot models too. Real catalogues have a popular set that drifts (a new
model is hot at launch and cold a month later) and a long tail that is idle for hours. Here:
- every `drift_every_h` hours, the models at the top `drift_swap` ranks of the Zipf order trade places with
  as many drawn from the tail (the ranks past `catalogue / 2`), so a hot model goes cold and a cold one hot;
- `idle_share` of the catalogue is idle for one stretch of `idle_h` hours a day, starting at a random hour
  (the day wraps), its share of the traffic spread over the models awake then.
The total rate is the fleet day's (the same diurnal hour of the Azure trace, times `rate_scale`), so the
fleet sized for one serves the other; every draw comes from the one seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flotilla_sim.errors import InputError
from flotilla_sim.workload import HOUR_S, Binned, Trace, bin_trace, diurnal_multiplier, zipf_weights


@dataclass(frozen=True)
class DriftSpec:
    drift_every_h: float = 2.0  # hours between two swaps of the popular set
    drift_swap: int = 20  # ranks swapped each time (the top ones with as many from the tail)
    idle_share: float = 0.5  # the share of the catalogue idle for a stretch each day
    idle_h: float = 8.0  # how long each of those is idle, in hours

    def check(self, num_models: int) -> None:
        """Raises InputError naming the flag of a value out of range for a catalogue of `num_models`."""
        if not self.drift_every_h > 0:
            raise InputError(f"--drift-every-h must be > 0, got {self.drift_every_h}")
        if not 0 <= self.drift_swap <= num_models // 2:
            raise InputError(f"--drift-swap must be between 0 and half the catalogue ({num_models // 2}), "
                             f"got {self.drift_swap}")
        if not 0 <= self.idle_share < 1:
            raise InputError(f"--idle-share must be in [0, 1), got {self.idle_share}")
        if not 0 <= self.idle_h < 24:
            raise InputError(f"--idle-h must be in [0, 24), got {self.idle_h}")


def rank_orders(num_models: int, ticks: int, tick_s: float, spec: DriftSpec, rng: np.random.Generator) -> np.ndarray:
    """int [ticks, num_models]: the model at each Zipf rank in each tick (rank 0 the most popular)."""
    order = np.arange(num_models)
    orders = np.empty((ticks, num_models), dtype=np.int64)
    epoch_ticks = max(round(spec.drift_every_h * HOUR_S / tick_s), 1)
    tail = np.arange(num_models // 2, num_models)
    for start in range(0, ticks, epoch_ticks):
        if start and spec.drift_swap:
            top = np.arange(spec.drift_swap)
            drawn = rng.choice(tail, size=spec.drift_swap, replace=False)
            order[top], order[drawn] = order[drawn].copy(), order[top].copy()
        orders[start:start + epoch_ticks] = order
    return orders


def awake(num_models: int, ticks: int, tick_s: float, spec: DriftSpec, rng: np.random.Generator) -> np.ndarray:
    """bool [ticks, num_models]: whether each model takes traffic in each tick."""
    mask = np.ones((ticks, num_models), dtype=bool)
    sleepers = rng.choice(num_models, size=round(spec.idle_share * num_models), replace=False)
    hour_of_tick = ((np.arange(ticks) + 0.5) * tick_s / HOUR_S) % 24.0
    for model, start_h in zip(sleepers, rng.uniform(0, 24, len(sleepers)), strict=True):
        since = (hour_of_tick - start_h) % 24.0
        mask[since < spec.idle_h, model] = False
    return mask


def drifting_day(base: Trace, num_models: int, tick_s: float, rate_scale: float, rng: np.random.Generator,
                 spec: DriftSpec = DriftSpec(), zipf_s: float = 1.0, trough: float = 0.25) -> Binned:
    """`fleet_day`'s traffic with the popular set drifting and the tail asleep (the module's docstring)."""
    spec.check(num_models)
    hour = bin_trace(base, tick_s, HOUR_S, 1)
    ticks = hour.arrivals.shape[0] * 24
    t_s = (np.arange(ticks) + 0.5) * tick_s
    expected = np.tile(hour.arrivals[:, 0], 24) * diurnal_multiplier(t_s, trough) * rate_scale
    weights = np.zeros((ticks, num_models))
    np.put_along_axis(weights, rank_orders(num_models, ticks, tick_s, spec, rng),
                      np.broadcast_to(zipf_weights(num_models, zipf_s), (ticks, num_models)), axis=1)
    weights *= awake(num_models, ticks, tick_s, spec, rng)
    weights /= np.maximum(weights.sum(axis=1, keepdims=True), 1e-300)
    arrivals = rng.poisson(expected[:, None] * weights).astype(np.float64)
    return Binned(tick_s, arrivals, np.tile(hour.prompt_tokens, 24), np.tile(hour.output_tokens, 24),
                  np.tile(hour.prompt_points, (24, 1)), np.tile(hour.output_points, (24, 1)))
