"""The drifting day (flotilla_sim/drift.py): the fleet day's total traffic, a popular set that changes every
`drift_every_h`, and half the catalogue asleep for `idle_h` a day; bad parameters name their flag."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from flotilla_sim.drift import DriftSpec, awake, drifting_day, rank_orders
from flotilla_sim.errors import InputError
from flotilla_sim.workload import fleet_day, read_azure

TICK_S = 60.0
MODELS = 100


@pytest.fixture(scope="module")
def days():
    base = read_azure("code")
    return (drifting_day(base, MODELS, TICK_S, 2.0, np.random.default_rng(3)),
            fleet_day(base, MODELS, TICK_S, 2.0, np.random.default_rng(3)))


def test_the_total_traffic_is_the_fleet_days(days) -> None:
    drifting, fixed = days
    assert drifting.arrivals.shape == fixed.arrivals.shape == (24 * 60, MODELS)
    per_hour = lambda b: b.arrivals.sum(axis=1).reshape(24, -1).sum(axis=1)  # noqa: E731
    assert np.allclose(per_hour(drifting), per_hour(fixed), rtol=0.05)


def test_the_popular_set_changes_every_two_hours(days) -> None:
    drifting, fixed = days
    busiest = [set(np.argsort(-drifting.arrivals[h * 60:(h + 2) * 60].sum(axis=0))[:10]) for h in range(0, 24, 2)]
    assert all(len(a & b) <= 5 for a, b in itertools.pairwise(busiest))  # mostly new each time
    fixed_busiest = [set(np.argsort(-fixed.arrivals[h * 60:(h + 2) * 60].sum(axis=0))[:10]) for h in range(0, 24, 2)]
    assert all(len(a & b) >= 7 for a, b in itertools.pairwise(fixed_busiest))  # the control


def test_half_the_catalogue_sleeps_eight_hours_and_the_rest_never(days) -> None:
    drifting, _ = days
    idle_ticks = (drifting.arrivals == 0).sum(axis=0)
    mask = awake(MODELS, 24 * 60, TICK_S, DriftSpec(), np.random.default_rng(0))
    asleep = (~mask).sum(axis=0)
    assert (asleep > 0).sum() == MODELS // 2 and all(abs(a - 8 * 60) <= 1 for a in asleep[asleep > 0])
    assert (idle_ticks >= 8 * 60).sum() >= MODELS // 2


def test_swaps_trade_the_top_ranks_with_the_tail() -> None:
    orders = rank_orders(10, 6, 3600.0, DriftSpec(drift_every_h=2, drift_swap=2), np.random.default_rng(0))
    assert (orders[0] == orders[1]).all() and (orders[0] == np.arange(10)).all()
    assert set(orders[2][:2]) <= set(range(5, 10)) and sorted(orders[2]) == list(range(10))
    assert not (orders[2] == orders[4]).all()


def test_the_same_seed_gives_the_same_day() -> None:
    base = read_azure("code")
    one, two = (drifting_day(base, 40, 300.0, 1.0, np.random.default_rng(5)) for _ in range(2))
    assert (one.arrivals == two.arrivals).all()


@pytest.mark.parametrize(("spec", "flag"), [
    (DriftSpec(drift_every_h=0), "--drift-every-h"),
    (DriftSpec(drift_swap=60), "--drift-swap"),
    (DriftSpec(idle_share=1.0), "--idle-share"),
    (DriftSpec(idle_h=24), "--idle-h"),
])
def test_parameters_out_of_range_name_their_flag(spec: DriftSpec, flag: str) -> None:
    with pytest.raises(InputError, match=flag):
        spec.check(MODELS)
