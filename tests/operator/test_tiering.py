"""decide_tier as a table (one row per rule) and its invariants over random histories: bounds hold, no level
of demand both promotes and demotes, and more demand never sends a model back to the pool."""

from __future__ import annotations

import math

import pytest
from flotilla_operator import tiering as t
from flotilla_operator.tiering import (
    DEDICATED,
    POOL,
    ModelTier,
    PoolView,
    TierDecision,
    TierHistory,
    TieringSpec,
    TierSample,
    decide_tier,
)
from hypothesis import given, settings
from hypothesis import strategies as st

NOW = 1_800_000_000.0
SPEC = TieringSpec()  # window 600 s, min stay 1800 s, 20 moves an hour, promote at 0.5 replicas, demote at 0.2
LONG_AGO = NOW - 10 * 3600
ROOMY_POOL = PoolView(replicas=4, demand_replicas=1.0)


def steady(demand: float, attainment: float | None = None, cold_loads: int = 0, every_s: float = 60.0,
           span_s: float = 900.0) -> TierHistory:
    """Samples every `every_s` over the last `span_s`, all alike."""
    count = int(span_s // every_s) + 1
    return TierHistory(tuple(TierSample(NOW - span_s + i * every_s, demand, attainment, cold_loads)
                             for i in range(count)))


def decide(history: TierHistory, tier: str, pool: PoolView = ROOMY_POOL, since_s: float = LONG_AGO,
           spec: TieringSpec = SPEC) -> TierDecision:
    return decide_tier(history, pool, ModelTier(tier, since_s, spec), NOW)


@pytest.mark.parametrize(("history", "tier", "pool", "since_s", "expected_tier", "reason"), [
    # the pool keeps a model of little demand that meets its SLO
    (steady(0.1, 0.99), POOL, ROOMY_POOL, LONG_AGO, POOL, t.REASON_STAYS),
    # sustained demand of half a replica or more: promoted
    (steady(0.6), POOL, ROOMY_POOL, LONG_AGO, DEDICATED, t.REASON_SUSTAINED_DEMAND),
    # missed SLO in the pool with real demand: promoted; with a trickle of demand: stays
    (steady(0.3, 0.8), POOL, ROOMY_POOL, LONG_AGO, DEDICATED, t.REASON_SLO_MISSED_IN_POOL),
    (steady(0.1, 0.5), POOL, ROOMY_POOL, LONG_AGO, POOL, t.REASON_STAYS),
    # one cold load a minute (60 an hour, over 6) with real demand: promoted; with a trickle: the pool's job
    (steady(0.3, None, cold_loads=1), POOL, ROOMY_POOL, LONG_AGO, DEDICATED, t.REASON_COLD_LOADS),
    (steady(0.05, None, cold_loads=1), POOL, ROOMY_POOL, LONG_AGO, POOL, t.REASON_STAYS),
    # a pool that cannot hold the model sends it away at once, bounds or not
    (steady(0.0), POOL, PoolView(4, 0, can_hold=False), NOW - 5, DEDICATED, t.REASON_POOL_CANNOT_HOLD),
    (steady(0.0), DEDICATED, PoolView(4, 0, can_hold=False), LONG_AGO, DEDICATED, t.REASON_STAYS),
    # under a window of history: hold
    (steady(5.0, span_s=300), POOL, ROOMY_POOL, LONG_AGO, POOL, t.REASON_GATHERING_HISTORY),
    # dedicated with demand: stays; idle and meeting its SLO with a roomy pool: demoted
    (steady(0.3), DEDICATED, ROOMY_POOL, LONG_AGO, DEDICATED, t.REASON_STAYS),
    (steady(0.1, 0.99), DEDICATED, ROOMY_POOL, LONG_AGO, POOL, t.REASON_DEMAND_LOW),
    (steady(0.0), DEDICATED, ROOMY_POOL, LONG_AGO, POOL, t.REASON_DEMAND_LOW),
    # idle but missing its SLO even on its own replicas: stays
    (steady(0.1, 0.9), DEDICATED, ROOMY_POOL, LONG_AGO, DEDICATED, t.REASON_SLO_MISSED_DEDICATED),
    # the pool has no room: 3.2 + 0.1 > 0.8 x 4
    (steady(0.1), DEDICATED, PoolView(4, 3.2), LONG_AGO, DEDICATED, t.REASON_POOL_FULL),
    # a pool scaled to zero with no demand takes an idle model
    (steady(0.0), DEDICATED, PoolView(0, 0), LONG_AGO, POOL, t.REASON_DEMAND_LOW),
    # bounds: the minimum stay holds a promotion and a demotion, the reason says which
    (steady(0.6), POOL, ROOMY_POOL, NOW - 1000, POOL, f"{t.REASON_MINIMUM_STAY}:{t.REASON_SUSTAINED_DEMAND}"),
    (steady(0.0), DEDICATED, ROOMY_POOL, NOW - 1000, DEDICATED, f"{t.REASON_MINIMUM_STAY}:{t.REASON_DEMAND_LOW}"),
])
def test_rules(history, tier, pool, since_s, expected_tier, reason) -> None:
    decision = decide(history, tier, pool, since_s)
    assert (decision.tier, decision.reason) == (expected_tier, reason)


def test_the_fleets_move_budget_holds_a_move_and_frees_after_an_hour() -> None:
    spent = TierHistory(steady(0.6).samples, tuple(NOW - 3000 + i for i in range(SPEC.max_moves_per_h)))
    held = decide(spent, POOL)
    assert (held.tier, held.reason) == (POOL, f"{t.REASON_MOVE_BUDGET_SPENT}:{t.REASON_SUSTAINED_DEMAND}")
    one_too_old = TierHistory(spent.samples, (NOW - 3601, *spent.fleet_moves_s[1:]))
    assert decide(one_too_old, POOL).tier == DEDICATED


def test_a_burst_is_not_sustained_demand_and_a_lull_is_not_idleness() -> None:
    """The lower quartile reads the pool's demand, the upper one dedicated's: a quarter of the window at 10
    replicas promotes nothing, and a quarter of it at zero demotes nothing."""
    samples = steady(0.0).samples
    burst = TierHistory(tuple(TierSample(s.at_s, 10.0 if i % 4 == 0 else 0.0) for i, s in enumerate(samples)))
    assert decide(burst, POOL).reason == t.REASON_STAYS
    lull = TierHistory(tuple(TierSample(s.at_s, 0.0 if i % 4 == 0 else 2.0) for i, s in enumerate(samples)))
    assert decide(lull, DEDICATED).reason == t.REASON_STAYS


def test_no_sample_in_the_window_holds() -> None:
    stale = TierHistory((TierSample(NOW - 5000, 0.0), TierSample(NOW - 4000, 0.0)))
    assert decide(stale, DEDICATED).reason == t.REASON_NO_RECENT_SAMPLES


def test_samples_older_than_the_window_do_not_count() -> None:
    old_busy = tuple(TierSample(NOW - 3000 + 60 * i, 5.0) for i in range(30))
    recent_idle = steady(0.0).samples
    decision = decide(TierHistory(old_busy + recent_idle), DEDICATED)
    assert (decision.tier, decision.demand_replicas) == (POOL, 0.0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"promote_demand_replicas": 0.2, "demote_demand_replicas": 0.2}, "demoteDemandReplicas < promoteDemandReplicas"),
    ({"promote_attainment": 0.99, "demote_attainment": 0.9}, "promoteAttainment <= demoteAttainment"),
    ({"promote_attainment": 0.0}, "0 < promoteAttainment"),
    ({"pool_fill_limit": 1.5}, "poolFillLimit"),
    ({"min_stay_s": -1}, "min_stay_s"),
    ({"window_s": math.nan}, "window_s"),
    ({"max_moves_per_h": 0}, "max_moves_per_h"),
])
def test_a_spec_out_of_range_is_refused_naming_the_field(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TieringSpec(**kwargs)


def test_an_unknown_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="tier must be one of"):
        ModelTier("gpu", LONG_AGO)


# ---- invariants

demands = st.floats(0, 8, allow_nan=False)
attainments = st.one_of(st.none(), st.floats(0, 1))


@st.composite
def histories(draw: st.DrawFn) -> TierHistory:
    count = draw(st.integers(0, 20))
    times = sorted(draw(st.lists(st.floats(NOW - 1500, NOW), min_size=count, max_size=count)))
    samples = tuple(TierSample(at, draw(demands), draw(attainments), draw(st.integers(0, 3))) for at in times)
    moves = tuple(draw(st.lists(st.floats(NOW - 7200, NOW), max_size=25)))
    return TierHistory(samples, moves)


pools = st.builds(PoolView, replicas=st.integers(0, 8), demand_replicas=st.floats(0, 8), can_hold=st.booleans())


@settings(max_examples=400, deadline=None)
@given(history=histories(), pool=pools, tier=st.sampled_from(t.TIERS), since_s=st.floats(NOW - 7200, NOW))
def test_bounds_hold(history: TierHistory, pool: PoolView, tier: str, since_s: float) -> None:
    decision = decide(history, tier, pool, since_s)
    assert decision.tier in t.TIERS
    if decision.moves_from(tier) and decision.reason != t.REASON_POOL_CANNOT_HOLD:
        assert NOW - since_s >= SPEC.min_stay_s
        assert sum(1 for at in history.fleet_moves_s if NOW - 3600 < at <= NOW) < SPEC.max_moves_per_h
        assert history.samples and history.samples[0].at_s <= NOW - SPEC.window_s
    if not pool.can_hold:
        assert decision.tier == DEDICATED


@settings(max_examples=300, deadline=None)
@given(history=histories(), pool=pools)
def test_no_history_both_promotes_and_demotes(history, pool) -> None:
    """Hysteresis: with the same history, a model promoted from the pool is not then demoted."""
    if decide(history, POOL, pool).tier == DEDICATED:
        assert decide(history, DEDICATED, pool).tier == DEDICATED


@settings(max_examples=300, deadline=None)
@given(history=histories(), pool=pools, tier=st.sampled_from(t.TIERS), extra=st.floats(0, 4))
def test_more_demand_never_sends_a_model_to_the_pool(history, pool, tier, extra) -> None:
    busier = TierHistory(tuple(TierSample(s.at_s, s.demand_replicas + extra, s.attainment, s.cold_loads)
                               for s in history.samples), history.fleet_moves_s)
    if decide(busier, tier, pool).tier == POOL:
        assert decide(history, tier, pool).tier == POOL
