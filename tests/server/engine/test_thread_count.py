"""The engine's thread count measured at start-up (engine/thread_count.py decides, engine/decode_timer.py
times): the candidates, the pick, when measuring stops, and an engine that measured, in both modes, keeps
its exact tokens and runs its steps on the count it logged."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from pathlib import Path

import pytest
import torch
from flotilla_server.engine.config import EngineConfig
from flotilla_server.engine.factory import make_engine as make_client
from flotilla_server.engine.messages import EngineOptions
from flotilla_server.engine.sampling_params import SamplingParams
from flotilla_server.engine.thread_count import (
    TIMED_STEPS,
    TOLERANCE,
    candidate_counts,
    describe,
    measure_count,
    pick_count,
)

from tests.support.engine_hooks import record_threads
from tests.support.hf_models import random_prompts

from .conftest import DEVICE, make_engine, run_to_completion

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
KEPT = re.compile(r"engine threads: a decode step of \d+ rows took .*; the engine runs on (\d+) ")


@pytest.mark.parametrize(("own", "expected"), [
    (1, [1]), (2, [2, 1]), (3, [3, 1]), (4, [4, 2, 1]), (15, [15, 7, 3, 1]), (16, [16, 8, 4, 2, 1]),
])
def test_candidates_are_the_default_count_halved_down_to_one(own, expected) -> None:
    assert candidate_counts(own) == expected


@pytest.mark.parametrize(("step_s", "expected"), [
    ({15: 0.010, 7: 0.008, 3: 0.006, 1: 0.009}, 3),  # the fastest
    ({15: 0.010, 7: 0.0100, 3: 0.0104}, 3),  # fewer threads, within the tolerance of the fastest
    ({15: 0.010, 7: 0.0106}, 15),  # fewer threads, beyond it
    ({4: 0.010, 2: 0.010 * (1 + TOLERANCE)}, 2),  # on the bound: kept
    ({2: 0.004}, 2),
])
def test_the_pick_is_the_fewest_threads_within_the_tolerance_of_the_fastest(step_s, expected) -> None:
    assert pick_count(step_s) == expected


def fake_steps(seconds_by_threads: dict[int, list[float]]):
    """run_step for measure_count: each count's steps take the listed seconds in turn; records each call."""
    calls: list[int] = []
    left = {t: list(s) for t, s in seconds_by_threads.items()}

    def run_step(threads: int) -> float:
        calls.append(threads)
        return left[threads].pop(0)

    return run_step, calls


def test_each_count_is_timed_as_the_least_of_its_steps_after_one_untimed() -> None:
    run_step, calls = fake_steps({2: [9.0, 0.005, 0.004, 0.006], 1: [9.0, 0.008, 0.007, 0.009]})
    kept, step_s = measure_count(2, run_step)
    assert step_s == {2: 0.004, 1: 0.007} and kept == 2
    assert calls == [2] * (1 + TIMED_STEPS) + [1] * (1 + TIMED_STEPS)


def test_measuring_stops_at_the_first_count_beyond_the_tolerance_of_the_fastest() -> None:
    """A model that needs its threads: 7 is slower than 15, so 3 and 1 are never run."""
    run_step, calls = fake_steps({15: [1.0, 0.5, 0.5, 0.5], 7: [1.0, 0.8, 0.8, 0.8]})
    kept, step_s = measure_count(15, run_step)
    assert kept == 15 and set(step_s) == {15, 7} and set(calls) == {15, 7}


def test_a_small_model_on_many_cores_keeps_the_count_that_ran_fastest() -> None:
    """As `tiny` on 16 cores (docs/benchmarks.md, "Engine modes"): fewer threads ran faster down to 3."""
    times = {15: 0.012, 7: 0.008, 3: 0.006, 1: 0.009}
    run_step, _ = fake_steps({t: [1.0] + [s] * TIMED_STEPS for t, s in times.items()})
    assert measure_count(15, run_step) == (3, times)


def test_the_log_line_names_every_count_and_the_one_kept() -> None:
    line = describe(64, {15: 0.0121, 7: 0.0064}, 7)
    assert line == ("engine threads: a decode step of 64 rows took 12.1 ms on 15, 6.4 ms on 7; "
                    "the engine runs on 7 (OMP_NUM_THREADS sets the count instead)")


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU threads")
def test_an_engine_that_measured_keeps_the_picked_count_and_its_exact_tokens(hf_model, caplog,
                                                                             monkeypatch) -> None:
    """The timed steps write into free KV blocks: the requests after them get their tokens exactly. One
    thread is made to look a second slower, so the count kept (2) is not the count measured last (1)."""
    from flotilla_server.engine import core

    monkeypatch.setattr(core, "measure_count", lambda own, run_step: measure_count(
        own, lambda threads: run_step(threads) + (1.0 if threads == 1 else 0.0)))
    loaded = hf_model("llama")[1]
    requests = {f"r{i}": (p, GREEDY) for i, p in enumerate(random_prompts([9, 40, 17], seed=3))}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        expected = run_to_completion(make_engine(loaded, max_num_seqs=4), requests)
        engine = make_engine(loaded, max_num_seqs=4)
        assert engine.measure_threads() is None  # one thread: nothing to choose from
        torch.set_num_threads(2)
        with caplog.at_level(logging.INFO, logger="flotilla.engine"):
            step_s = engine.measure_threads()
        assert step_s is not None and list(step_s) == [2, 1] and step_s[1] > 1.0
        assert torch.get_num_threads() == 2
        assert describe(4, step_s, 2) in caplog.text
        got = run_to_completion(engine, requests)
    finally:
        torch.set_num_threads(before)
    assert {r: v["token_ids"] for r, v in got.items()} == {r: v["token_ids"] for r, v in expected.items()}


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU threads")
@pytest.mark.parametrize("mode", ["inprocess", "process"])
async def test_the_steps_run_on_the_count_the_engine_logged(hf_model, mode, tmp_path: Path, monkeypatch,
                                                           caplog, capfd) -> None:
    """The count belongs to the thread that runs the steps: the engine process's main thread, or the
    in-process engine's own thread."""
    path, loaded = hf_model("llama")
    prompt = random_prompts([12], seed=7)[0]
    expected = run_to_completion(make_engine(loaded), {"a": (prompt, GREEDY)})["a"]["token_ids"]
    counts = tmp_path / "threads"
    options = EngineOptions(measure_threads=True, step_hook=functools.partial(record_threads, str(counts)))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the engine process's default count
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the in-process engine thread's
    engine = make_client(EngineConfig(model=str(path), device=DEVICE, max_num_seqs=4), mode,  # type: ignore[arg-type]
                         options, loaded=loaded if mode == "inprocess" else None)
    try:
        with caplog.at_level(logging.INFO, logger="flotilla.engine"):
            engine.start()
        stream = engine.submit("a", prompt, GREEDY, asyncio.get_running_loop())
        events = [e async for e in stream]
    finally:
        engine.shutdown()
        torch.set_num_threads(before)
    kept = KEPT.search(caplog.text + capfd.readouterr().err)
    assert kept is not None, "no thread-count line in the engine's log"
    assert set(counts.read_text().split()) == {kept.group(1)}
    assert [t for e in events for t in e.token_ids] == expected
