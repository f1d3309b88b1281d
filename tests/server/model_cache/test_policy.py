"""The model cache's eviction policy: a table of cases, then properties over random pools."""

from __future__ import annotations

import pytest
from flotilla_server.model_cache.policy import (
    REASON_BUSY,
    REASON_EVICT_LRU,
    REASON_FITS,
    REASON_INFEASIBLE,
    REASON_MIN_RESIDENCY,
    Action,
    Resident,
    decide_load,
    evictable,
)
from hypothesis import given, settings
from hypothesis import strategies as st

GB = 10**9
NOW = 1000.0
MIN_RES = 60.0


def resident(name: str, gb: int = 4, loaded_ago_s: float = 600, used_ago_s: float = 100, busy: bool = False):
    return Resident(name, gb * GB, NOW - loaded_ago_s, NOW - used_ago_s, busy)


@pytest.mark.parametrize(
    ("model_gb", "residents", "action", "reason", "evict"),
    [
        # fits beside what is there
        (4, [resident("a")], Action.LOAD, REASON_FITS, ()),
        (6, [resident("a")], Action.LOAD, REASON_FITS, ()),
        # the least recently used idle model goes, and only it
        (4, [resident("a", used_ago_s=10), resident("b", used_ago_s=500)], Action.LOAD, REASON_EVICT_LRU, ("b",)),
        # two victims when one is not enough, LRU first
        (8, [resident("a", used_ago_s=10), resident("b", used_ago_s=500), resident("c", gb=2, used_ago_s=5)],
         Action.LOAD, REASON_EVICT_LRU, ("b", "a")),
        # a busy model is skipped even when it is the oldest
        (4, [resident("a", used_ago_s=10), resident("b", used_ago_s=500, busy=True)],
         Action.LOAD, REASON_EVICT_LRU, ("a",)),
        # everyone busy: wait for a finish
        (4, [resident("a", busy=True), resident("b", busy=True)], Action.WAIT, REASON_BUSY, ()),
        # the only idle model is too young: wait for its residency to pass
        (4, [resident("a", busy=True), resident("b", loaded_ago_s=20)], Action.WAIT, REASON_MIN_RESIDENCY, ()),
        # larger than the whole budget: refused at once, even with the pool empty
        (11, [], Action.REFUSE, REASON_INFEASIBLE, ()),
    ],
)
def test_table(model_gb, residents, action, reason, evict):
    decision = decide_load(model_gb * GB, residents, 10 * GB, NOW, MIN_RES)
    assert (decision.action, decision.reason, decision.evict) == (action, reason, evict)


def test_wait_names_when_the_young_model_becomes_evictable():
    decision = decide_load(4 * GB, [resident("a", busy=True), resident("b", loaded_ago_s=20)], 10 * GB, NOW, MIN_RES)
    assert decision.retry_after_s == pytest.approx(40.0)


residents_st = st.lists(
    st.builds(
        Resident,
        name=st.text("abcdefgh", min_size=1, max_size=3),
        memory_bytes=st.integers(1, 8) .map(lambda g: g * GB),
        loaded_at_s=st.floats(0, NOW),
        last_used_s=st.floats(0, NOW),
        busy=st.booleans(),
    ),
    max_size=6,
    unique_by=lambda r: r.name,
)


@settings(max_examples=400, deadline=None)
@given(model_gb=st.integers(1, 12), residents=residents_st, budget_gb=st.integers(1, 24))
def test_properties(model_gb, residents, budget_gb):
    budget = budget_gb * GB
    decision = decide_load(model_gb * GB, residents, budget, NOW, MIN_RES)
    by_name = {r.name: r for r in residents}
    if model_gb * GB > budget:
        assert decision.action is Action.REFUSE
        return
    assert decision.action is not Action.REFUSE
    victims = [by_name[n] for n in decision.evict]
    # never a busy model, never one younger than the minimum residency
    assert all(evictable(v, NOW, MIN_RES) for v in victims)
    if decision.action is Action.LOAD:
        used = sum(r.memory_bytes for r in residents) - sum(v.memory_bytes for v in victims)
        assert used + model_gb * GB <= budget  # the new model fits after the evictions
        if victims:  # minimal: without the last victim it would not fit
            assert used + victims[-1].memory_bytes + model_gb * GB > budget
        # the victims are the least recently used evictable models, in order
        candidates = sorted((r for r in residents if evictable(r, NOW, MIN_RES)), key=lambda r: (r.last_used_s, r.name))
        assert victims == candidates[: len(victims)]
    else:
        assert not decision.evict
        free_if_all_evicted = budget - sum(r.memory_bytes for r in residents if not evictable(r, NOW, MIN_RES))
        assert model_gb * GB > free_if_all_evicted  # waiting only when evicting every candidate is not enough
