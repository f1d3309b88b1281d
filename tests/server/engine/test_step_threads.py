"""The thread count of small steps (engine/step_threads.py): the faster count runs, the other is tried at
growing intervals, a taken or freed core is followed; the runner restores its thread's count."""

from __future__ import annotations

import pytest
import torch
from flotilla_contract.flags import SMALL_STEP_MAX_ROWS
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.step_threads import (
    EXPLORE_MAX_STEPS,
    EXPLORE_MIN_STEPS,
    TRIAL_STEPS,
    SmallStepThreads,
    faster_threads,
    next_interval,
)

from tests.support.hf_models import random_prompts

from .conftest import DEVICE, make_engine, run_to_completion

OWN, WIDE = 1, 2


def drive(policy: SmallStepThreads, seconds: dict[int, float], steps: int, rows: int = 1) -> list[int]:
    """`steps` small steps of `rows` rows, each taking `seconds[threads]`; the counts chosen."""
    chosen = []
    for _ in range(steps):
        threads = policy.choose(rows)
        policy.observe(rows, threads, seconds[threads])
        chosen.append(threads)
    return chosen


@pytest.mark.parametrize(("interval", "before", "after", "expected"), [
    (EXPLORE_MIN_STEPS, WIDE, WIDE, 2 * EXPLORE_MIN_STEPS),
    (EXPLORE_MAX_STEPS, WIDE, WIDE, EXPLORE_MAX_STEPS),
    (EXPLORE_MAX_STEPS, WIDE, OWN, EXPLORE_MIN_STEPS),
    (4 * EXPLORE_MIN_STEPS, OWN, WIDE, EXPLORE_MIN_STEPS),
])
def test_next_interval_table(interval, before, after, expected) -> None:
    assert next_interval(interval, before, after) == expected


@pytest.mark.parametrize("rows", [0, SMALL_STEP_MAX_ROWS + 1, 64])
def test_steps_that_are_not_small_keep_the_own_count(rows) -> None:
    policy = SmallStepThreads(OWN, WIDE)
    assert drive(policy, {OWN: 0.01, WIDE: 0.001}, 40, rows) == [OWN] * 40
    assert policy.mean_s(rows) == {}


def test_a_wide_count_not_above_the_own_is_never_used() -> None:
    policy = SmallStepThreads(2, 2)
    assert set(drive(policy, {2: 0.01}, 40)) == {2}


@pytest.mark.parametrize(("mean_s", "expected"), [
    ({}, None),
    ({OWN: 0.02}, None),
    ({OWN: 0.02, WIDE: 0.01}, WIDE),
    ({OWN: 0.01, WIDE: 0.02}, OWN),
    ({OWN: 0.01, WIDE: 0.01}, OWN),  # a tie leaves the HTTP core free
])
def test_faster_threads_table(mean_s, expected) -> None:
    assert faster_threads(mean_s, OWN, WIDE) == expected


def test_each_count_is_measured_on_its_second_step_then_the_faster_runs() -> None:
    policy = SmallStepThreads(OWN, WIDE)
    for threads, seconds in [(OWN, 0.3), (OWN, 0.04), (WIDE, 0.5), (WIDE, 0.025)]:  # first steps: waking threads
        assert policy.choose(1) == threads
        policy.observe(1, threads, seconds)
    assert policy.mean_s(1) == {OWN: 0.04, WIDE: 0.025}
    assert policy.choose(1) == WIDE


def test_the_other_count_is_tried_for_two_steps_at_doubling_intervals() -> None:
    policy = SmallStepThreads(OWN, WIDE)
    chosen = drive(policy, {OWN: 0.04, WIDE: 0.025}, 1_100)
    assert chosen[:4] == [OWN, OWN, WIDE, WIDE]
    starts = [i for i in range(5, len(chosen)) if chosen[i] == OWN and chosen[i - 1] == WIDE]
    assert all(chosen[i:i + TRIAL_STEPS] == [OWN] * TRIAL_STEPS for i in starts)
    # the first trial is the 16th step after the last measuring one; each next, `interval` steps after a trial ends
    gaps = [b - a for a, b in zip([3, *starts[:-1]], starts, strict=True)]
    assert gaps[:6] == [16] + [n + TRIAL_STEPS - 1 for n in (32, 64, 128, 256, 256)]


def test_a_taken_core_is_left_at_once_and_a_freed_one_found_within_two_trial_intervals() -> None:
    policy = SmallStepThreads(OWN, WIDE)
    drive(policy, {OWN: 0.04, WIDE: 0.025}, 200)
    taken = drive(policy, {OWN: 0.04, WIDE: 0.12}, 24)  # a neighbour takes the second core
    assert taken[0] == WIDE and taken[1:].count(WIDE) == TRIAL_STEPS  # one trial, EXPLORE_MIN_STEPS later
    freed = drive(policy, {OWN: 0.04, WIDE: 0.025}, 2 * EXPLORE_MIN_STEPS + 2 * TRIAL_STEPS + 3)
    assert freed[-3:] == [WIDE] * 3


def test_row_counts_are_measured_apart() -> None:
    policy = SmallStepThreads(OWN, WIDE)
    drive(policy, {OWN: 0.04, WIDE: 0.025}, 10, rows=1)
    drive(policy, {OWN: 0.05, WIDE: 0.09}, 10, rows=4)
    assert policy.choose(1) == WIDE
    assert policy.choose(4) == OWN


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU threads: an engine on a GPU never switches them")
def test_the_runner_keeps_exact_tokens_and_restores_the_threads_own_count(hf_model) -> None:
    loaded = hf_model("llama")[1]
    prompts = random_prompts([9, 17], seed=11)
    requests = {f"r{i}": (p, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
                for i, p in enumerate(prompts)}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine_off, threads_off, threads_on = make_engine(loaded, small_step_threads=0), [], []
        engine_off.add_step_listener(lambda record: threads_off.append(record.num_threads))
        off = run_to_completion(engine_off, requests)
        engine = make_engine(loaded, small_step_threads=2)
        engine.add_step_listener(lambda record: threads_on.append(record.num_threads))
        on = run_to_completion(engine, requests)
        assert torch.get_num_threads() == 1
        measured = engine.runner._threads.mean_s(2)  # the two-row decode steps ran on both counts
        assert set(measured) == {1, 2}
        assert set(threads_off) == {1} and set(threads_on) == {1, 2}  # each step's record says its count
    finally:
        torch.set_num_threads(before)
    assert {r: v["token_ids"] for r, v in on.items()} == {r: v["token_ids"] for r, v in off.items()}
