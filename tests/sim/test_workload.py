import numpy as np
import pytest
from flotilla_sim.errors import InputError
from flotilla_sim.workload import (
    bin_trace,
    diurnal_multiplier,
    fleet_day,
    on_off,
    read_azure,
    read_trace,
    synthetic,
    write_trace,
    zipf_weights,
)


def test_trace_file_round_trips(tmp_path, small_trace):
    path = tmp_path / "t.csv"
    write_trace(small_trace, path)
    back = read_trace(path)
    assert np.allclose(back.arrival_s, small_trace.arrival_s, atol=1e-6)
    assert (back.model == small_trace.model).all() and (back.output_tokens == small_trace.output_tokens).all()


def test_trace_file_without_a_column_is_refused(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("arrival_s,model\n0.5,0\n")
    with pytest.raises(InputError, match="the header is 'arrival_s,model', which lacks prompt_tokens, output_tokens"):
        read_trace(path)


def test_a_spreadsheet_s_byte_order_mark_is_not_part_of_the_header(tmp_path, small_trace):
    path = tmp_path / "t.csv"
    write_trace(small_trace, path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert len(read_trace(path)) == len(small_trace)


def test_zipf_s1_makes_the_first_model_n_times_the_nth():
    weights = zipf_weights(1000)
    assert weights.sum() == pytest.approx(1.0)
    assert weights[0] / weights[9] == pytest.approx(10.0)


def test_binning_keeps_every_request(small_trace):
    binned = bin_trace(small_trace, 5.0)
    assert binned.arrivals.sum() == len(small_trace)
    assert binned.prompt_points.shape == (binned.arrivals.shape[0], 8)


def test_on_off_is_silent_when_off():
    times = on_off(10.0, on_s=5.0, off_s=15.0, duration_s=200.0, rng=np.random.default_rng(0))
    assert len(times) > 0 and ((times % 20.0) < 5.0).all()


def test_diurnal_multiplier_peaks_at_the_peak_hour():
    assert diurnal_multiplier(14 * 3600.0) == pytest.approx(1.0)
    assert diurnal_multiplier(2 * 3600.0) == pytest.approx(0.25)


def test_fleet_day_is_determined_by_its_seed():
    base = read_azure("code")
    one = fleet_day(base, 50, 60.0, 2.0, np.random.default_rng(3))
    two = fleet_day(base, 50, 60.0, 2.0, np.random.default_rng(3))
    other = fleet_day(base, 50, 60.0, 2.0, np.random.default_rng(4))
    assert one.arrivals.shape == (24 * 60, 50)
    assert (one.arrivals == two.arrivals).all() and not (one.arrivals == other.arrivals).all()
    assert one.arrivals[:, 0].sum() > one.arrivals[:, 49].sum()  # Zipf: the head model is busier


def test_synthetic_spreads_over_the_catalogue():
    rng = np.random.default_rng(0)
    trace = synthetic(np.linspace(0, 100, 2000), 5, rng)
    assert set(np.unique(trace.model)) == set(range(5))
