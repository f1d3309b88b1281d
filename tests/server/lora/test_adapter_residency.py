"""The adapter slot rule (engine/adapter_residency.py): a table of cases, and properties over random traffic:
an adapter with sequences running or waiting is never evicted, and never more than max_loras are resident."""

from __future__ import annotations

import pytest
from flotilla_server.engine.adapter_residency import SlotChoice, choose_slot
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.mark.parametrize(("resident", "wanted", "in_use", "last_used", "expected"), [
    (["a", "b"], "b", {"b": 0}, {}, SlotChoice(1, load=False)),  # resident: its own slot, no copy
    (["a", None, None], "c", {"a": 1}, {}, SlotChoice(1)),  # the lowest free slot
    (["a", "b"], "c", {}, {"a": 5.0, "b": 3.0}, SlotChoice(1, evicts="b")),  # least recently used
    (["a", "b"], "c", {"b": 2}, {"a": 5.0, "b": 3.0}, SlotChoice(0, evicts="a")),  # b is pinned: a goes
    (["a", "b"], "c", {"a": 1, "b": 1}, {}, None),  # every slot pinned: it waits
    (["a", "b"], "c", {}, {"a": 1.0, "b": 1.0}, SlotChoice(0, evicts="a")),  # a tie: the lower slot
    (["a", "b"], "c", {}, {"b": 1.0}, SlotChoice(0, evicts="a")),  # never used counts as oldest
    ([None], "a", {"a": 3}, {}, SlotChoice(0)),  # its own waiting sequences do not stop its load
])
def test_the_slot_rule(resident, wanted, in_use, last_used, expected):
    assert choose_slot(resident, wanted, in_use, last_used) == expected


ADAPTERS = ("a", "b", "c", "d", "e")


@settings(max_examples=200, deadline=None)
@given(max_loras=st.integers(1, 4),
       events=st.lists(st.tuples(st.sampled_from(("want", "finish")), st.sampled_from(ADAPTERS)), max_size=60))
def test_a_pinned_adapter_is_never_evicted_and_at_most_max_loras_are_resident(max_loras, events):
    resident: list[str | None] = [None] * max_loras
    in_use = dict.fromkeys(ADAPTERS, 0)
    last_used: dict[str, float] = {}
    for now, (kind, name) in enumerate(events):
        if kind == "finish":
            in_use[name] = max(0, in_use[name] - 1)
            continue
        pinned = {a for a in resident if a is not None and in_use[a] > 0}
        choice = choose_slot(resident, name, in_use, last_used)
        if choice is None:  # it waits: only when every slot holds a pinned adapter (and it is not resident)
            assert len(pinned) == max_loras and name not in resident
            continue
        if choice.evicts is not None:
            assert choice.evicts not in pinned and None not in resident
        assert resident[choice.slot] in (None, choice.evicts, name)
        resident[choice.slot] = name
        last_used[name] = float(now)
        in_use[name] += 1
        held = [a for a in resident if a is not None]
        assert len(held) <= max_loras and len(set(held)) == len(held)
        assert pinned <= set(held) | {name}  # no pinned adapter left its slot
