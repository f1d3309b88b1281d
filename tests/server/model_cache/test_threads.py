"""Each engine's share of the CPU threads in a multi-model server: a table, then properties."""

from __future__ import annotations

import itertools

import pytest
from flotilla_server.model_cache.threads import (
    engine_threads,
    most_resident,
    small_step_threads,
    threads_for_engines,
)
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("budget", "footprints", "expected"),
    [
        (10, [4, 4, 4], 2),  # two of three fit
        (12, [4, 4, 4], 3),  # all three, exactly
        (10, [1, 9, 9], 2),  # the small one and one large
        (10, [2, 2, 2, 9], 3),  # the smallest first: three small rather than one large
        (10, [11], 1),  # never fits (refused at the door): still one engine's share
        (10, [], 1),  # no members yet
    ],
)
def test_most_resident_table(budget, footprints, expected):
    assert most_resident(budget, footprints) == expected


@pytest.mark.parametrize(
    ("cpu_threads", "models", "expected"),
    [
        (15, 3, 5),  # 16 cores, one left to the event loop, three models at once
        (15, 2, 7),  # a thread left over rather than oversubscribing
        (1, 3, 1),  # a 2-core box: never fewer than one
        (8, 1, 8),  # one model at a time takes them all
        (4, 0, 4),  # no member yet counts as one
    ],
)
def test_engine_threads_table(cpu_threads, models, expected):
    assert engine_threads(cpu_threads, models) == expected


@given(budget=st.integers(0, 100), footprints=st.lists(st.integers(1, 40), max_size=7))
def test_most_resident_is_the_largest_set_that_fits(budget, footprints):
    count = most_resident(budget, footprints)
    fits = [n for n in range(len(footprints) + 1)
            if any(sum(c) <= budget for c in itertools.combinations(footprints, n))]
    assert count == max(1, max(fits))


@given(cpu_threads=st.integers(1, 256), models=st.integers(1, 64))
def test_engines_never_oversubscribe_unless_one_thread_each(cpu_threads, models):
    each = engine_threads(cpu_threads, models)
    assert each >= 1
    assert each * models <= cpu_threads or each == 1


@pytest.mark.parametrize(
    ("omp_num_threads", "usable", "expected"),
    [
        ("1", 2, 1),  # the CLI's default on 2 usable CPUs: one left to the event loop
        (None, 4, 4),  # unset (a caller other than the CLI): the usable CPUs
        ("64", 4, 4),  # a pod with a quota of 4 CPUs on a 64-core node: never past the quota
        ("", 3, 3),
    ],
)
def test_threads_for_engines_table(omp_num_threads, usable, expected):
    assert threads_for_engines(omp_num_threads, usable) == expected


@pytest.mark.parametrize(
    ("share", "flag", "expected"),
    [
        (1, None, 1),  # the default (every usable CPU) is capped at the share
        (5, None, 5),
        (5, 16, 5),  # asked for more: the share
        (5, 2, 2),  # asked for fewer: fewer
        (5, 0, 0),  # off stays off
    ],
)
def test_small_steps_never_borrow_past_the_share(share, flag, expected):
    assert small_step_threads(share, flag) == expected


@given(cpu_threads=st.integers(1, 256), models=st.integers(1, 64), flag=st.none() | st.integers(0, 512))
def test_engines_small_steps_included_never_oversubscribe_unless_one_thread_each(cpu_threads, models, flag):
    each = engine_threads(cpu_threads, models)
    widest = max(each, small_step_threads(each, flag))  # a step runs on its own count or its small-step count
    assert widest == each
    assert widest * models <= cpu_threads or widest == 1
