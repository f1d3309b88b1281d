import json

import pytest
from flotilla_sim.server_model import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, fit_bench, roofline


def test_roofline_is_bandwidth_bound_for_decode_and_compute_bound_for_long_prefill():
    profile = roofline()
    memory_s = 16e9 / (3.35e12 * BANDWIDTH_EFFICIENCY)
    assert profile.step_s(1) == pytest.approx(memory_s)
    assert profile.step_s(64) == pytest.approx(memory_s)  # 64 tokens of compute are far under the weights' read
    compute_s = 2 * 8e9 * (1 + 10_000) / (990e12 * COMPUTE_EFFICIENCY)
    assert profile.step_s(1, 10_000) == pytest.approx(compute_s)
    assert profile.load_s == pytest.approx(8.0)
    assert "roofline model" in profile.source and "not measured" in profile.source


def _online(path, concurrency, tpot_ms, ttft_ms):
    summary = {"config": {"model": "tiny", "concurrency": concurrency, "prompt_len_min": 10, "prompt_len_max": 30},
               "tpot_ms": {"p50": tpot_ms}, "ttft_ms": {"p50": ttft_ms}}
    path.write_text(json.dumps({"summary": summary}))


def test_fit_recovers_a_linear_step_time(tmp_path):
    # step = 2 ms + 0.5 ms per sequence; prefill of 20 tokens adds 0.1 ms per token
    _online(tmp_path / "online-c1.json", 1, 2.5, 2.5 + 20 * 0.1)
    _online(tmp_path / "online-c32.json", 32, 18.0, 50.0)
    profile = fit_bench(tmp_path)
    assert profile.step_base_s == pytest.approx(2e-3)
    assert profile.step_per_seq_s == pytest.approx(0.5e-3)
    assert profile.step_per_token_s == pytest.approx(0.1e-3)
    assert profile.source.startswith("measured")


def test_fit_of_the_repository_bench_grows_with_the_batch():
    profile = fit_bench("docs/bench")
    assert profile.step_s(64) > profile.step_s(1) > 0


def test_fit_needs_two_points(tmp_path):
    _online(tmp_path / "online-c1.json", 1, 2.5, 3.0)
    with pytest.raises(ValueError, match="two"):
        fit_bench(tmp_path)
