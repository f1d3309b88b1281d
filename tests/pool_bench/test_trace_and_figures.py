"""The pool benchmark's pure parts (e2e/pool_bench): the trace it builds from a real one, and the figures
it computes. The benchmark itself runs under `make bench`, not here."""

from __future__ import annotations

import numpy as np
import pytest
from flotilla_sim.workload import make_trace

from e2e.pool_bench.report import integrate, percentile
from e2e.pool_bench.trace import TraceShape, build, fitting_divisor, scale_tokens

MODELS = ("m1", "m2", "m3", "m4")


def steady(count: int = 4000, every_s: float = 0.5, prompt: int = 1000, output: int = 100):
    return make_trace([i * every_s for i in range(count)], [0] * count, [prompt] * count, [output] * count)


def test_the_window_is_thinned_and_compressed_and_starts_at_zero():
    requests = build(steady(), MODELS, TraceShape(start_s=100, window_s=200, keep_every=4, compression=4))
    assert len(requests) == 100  # 400 arrivals in the window, every 4th kept
    assert requests[0].at_s == 0 and requests[1].at_s == pytest.approx(2.0 / 4)
    assert requests[-1].at_s == pytest.approx(198 / 4)
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)


def test_the_same_shape_gives_the_same_requests_and_popularity_follows_zipf():
    shape = TraceShape(start_s=0, window_s=2000, keep_every=1)
    requests = build(steady(), MODELS, shape)
    assert requests == build(steady(), MODELS, shape)
    shares = [sum(r.model == m for r in requests) / len(requests) for m in MODELS]
    expected = np.array([1, 1 / 2, 1 / 3, 1 / 4]) / sum([1, 1 / 2, 1 / 3, 1 / 4])  # 0.48, 0.24, 0.16, 0.12
    assert np.allclose(shares, expected, atol=0.03), shares


@pytest.mark.parametrize(("prompt", "output", "divisor", "context", "scaled"), [
    (1000, 100, 8, 2048, (125, 13)),  # each divided, rounded up
    (3, 0, 8, 2048, (1, 1)),  # never below 1
    (14_050, 39, 7, 2048, (2008, 6)),  # the conv trace's longest prompt fits at its fitting divisor
    (20_000, 800, 8, 2048, (1948, 100)),  # too long: the prompt is cut so prompt + output fits
])
def test_token_counts_are_divided_rounded_up_and_fit_the_context(prompt, output, divisor, context, scaled):
    assert scale_tokens(prompt, output, divisor, context) == scaled
    assert sum(scaled) <= context


def test_the_fitting_divisor_is_the_smallest_that_fits_the_longest_request():
    trace = make_trace([0, 1, 2], [0, 0, 0], [100, 14_050, 2000], [10, 39, 500])
    assert fitting_divisor(trace, 2048) == 7  # 14,089 ÷ 7 ≤ 2048 < 14,089 ÷ 6
    requests = build(trace, MODELS, TraceShape(start_s=0, window_s=10, keep_every=1))
    assert max(r.prompt_tokens + r.output_tokens for r in requests) <= 2048


@pytest.mark.parametrize(("samples", "start", "end", "expected"), [
    ([], 0, 10, 0.0),
    ([(0, 2)], 0, 10, 20.0),  # one sample holds to the end
    ([(0, 1), (5, 3)], 0, 10, 5 * 1 + 5 * 3),
    ([(0, 1), (5, 3)], 4, 6, 1 * 1 + 1 * 3),  # only the window counts
    ([(2, 4)], 0, 3, 12.0),  # before the first sample: the first sample's value
    ([(0, 1), (5, 3)], 6, 6, 0.0),
])
def test_replica_seconds_integrate_the_step_function_over_the_window(samples, start, end, expected):
    assert integrate(samples, start, end) == pytest.approx(expected)


def test_percentiles_are_numpys_linear_ones():
    values = [0.3, 0.1, 5.0, 0.2, 0.25, 9.0, 0.15]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None
