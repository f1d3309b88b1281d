"""The adapter routing rule (flotilla_gateway/adapter_routing.py): a table of decisions and its properties."""

from __future__ import annotations

import pytest
from flotilla_gateway.adapter_routing import SPREAD_LOAD, adapter_width, choose_for_adapter
from flotilla_gateway.routing import PodView, candidates, load_bound
from hypothesis import given
from hypothesis import strategies as st


def pod(address: str, load: int = 0, accepting: bool = True) -> PodView:
    return PodView(address=address, running=load, slots=16, queue_capacity=128, load_age_s=0.1, accepting=accepting)


A, B, C, D = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"


@pytest.mark.parametrize(("pods", "holders", "adapter_load", "free", "expected", "why"), [
    ([pod(A), pod(B), pod(C)], {B}, 0, {A: 4, B: 3, C: 4}, B, "a holder takes a cold adapter's request"),
    ([pod(A, 3), pod(B, 2), pod(C, 3)], {A}, 3, {A: 3, B: 4, C: 4}, A, "one pod for an adapter under SPREAD_LOAD"),
    ([pod(A, 2), pod(B, 0), pod(C, 1)], set(), 0, {A: 1, B: 0, C: 4}, C, "a cold adapter goes to the most free slots"),
    ([pod(A, 6), pod(B, 1), pod(C, 1)], {A}, 8, {A: 3, B: 1, C: 4}, C,
     "a hot adapter spreads: its holder, then the pod with the most free slots, the less loaded first"),
    ([pod(A, 9), pod(B, 1), pod(C, 2)], {A}, 2, {A: 3, B: 0, C: 4}, C,
     "a holder over the load bound spills to the most free slots within it"),
    ([pod(A, 2), pod(B, 2), pod(D, 0)], {A, B}, 16, {A: 0, B: 0, D: 4}, D,
     "a new pod (all slots free, no load) takes a hot adapter's traffic"),
    ([pod(A, 0, accepting=False), pod(B, 5)], {A}, 0, {A: 4, B: 0}, B, "a draining holder is passed over"),
    ([pod(D), pod(A)], {A}, 8, {A: 3, D: 4}, A, "at equal load a holder, not a pod that would load the adapter"),
])
def test_the_rule(pods, holders, adapter_load, free, expected, why):
    chosen = choose_for_adapter(pods, "support-bot", frozenset(holders), adapter_load, free)
    assert chosen is not None and chosen.address == expected, why


def test_no_pod_no_choice():
    assert choose_for_adapter([], "a", frozenset(), 0, {}) is None


@pytest.mark.parametrize(("load", "pods", "width"), [(0, 3, 1), (SPREAD_LOAD - 1, 3, 1), (SPREAD_LOAD, 3, 2),
                                                     (5 * SPREAD_LOAD, 3, 3), (0, 0, 1)])
def test_an_adapter_s_width_grows_with_its_load_up_to_every_pod(load, pods, width):
    assert adapter_width(load, pods) == width


views = st.builds(lambda i, load, accepting: pod(f"10.0.0.{i}:8000", load, accepting),
                  st.integers(1, 9), st.integers(0, 30), st.booleans())


@given(pods=st.lists(views, min_size=1, max_size=6, unique_by=lambda p: p.address),
       holders=st.sets(st.sampled_from([f"10.0.0.{i}:8000" for i in range(1, 10)])),
       adapter_load=st.integers(0, 60), free=st.dictionaries(st.sampled_from([f"10.0.0.{i}:8000" for i in range(1, 10)]),
                                                             st.integers(0, 8)),
       adapter=st.text(min_size=1, max_size=12))
def test_properties(pods, holders, adapter_load, free, adapter):
    chosen = choose_for_adapter(pods, adapter, frozenset(holders), adapter_load, free)
    pool = candidates(pods)
    assert chosen in pool  # never a saturated pod while another is not
    assert chosen.load + 1 <= load_bound(sum(p.load for p in pool), len(pool))  # never past the bound
    again = choose_for_adapter(list(reversed(pods)), adapter, frozenset(holders), adapter_load, free)
    assert again == chosen  # the order the pods come in does not matter: replicas agree
    fitting_holders = [p for p in pool if p.address in holders
                       and p.load + 1 <= load_bound(sum(q.load for q in pool), len(pool))]
    if fitting_holders and adapter_width(adapter_load, len(pool)) >= len([p for p in pool if p.address in holders]):
        assert chosen.address in holders or chosen.load < min(p.load for p in fitting_holders)
