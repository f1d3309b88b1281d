"""`flotilla-bench offline --quick`: the smoke run writes the documented fields, a table and a plot."""

from __future__ import annotations

import json
import shlex

import pytest
from flotilla_server.bench.cli import main

from tests.docs.doc_blocks import ROOT

pytestmark = pytest.mark.slow  # tens of seconds here; -m 'not slow' skips it


def documented_quick_command(tmp_path) -> list[str]:
    """docs/benchmarks.md's smoke command, its output paths moved under tmp_path."""
    (line,) = [line for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
               if line.startswith("flotilla-bench offline --quick")]
    words = shlex.split(line)[1:]
    return [str(tmp_path / word.rsplit("/", 1)[-1]) if word.startswith("bench-results/") else word for word in words]


def test_offline_quick_smoke(tmp_path, capsys) -> None:
    out, png = tmp_path / "quick.json", tmp_path / "quick.png"
    assert main(documented_quick_command(tmp_path)) == 0
    report = json.loads(out.read_text())
    assert set(report["workloads"]) == {"tiny", "llama-small"}
    for w in report["workloads"].values():
        for mode in ("continuous", "static", "static_unpadded", "sequential", "transformers"):
            assert w["modes"][mode]["output_tokens_per_s"] > 0
            assert w["modes"][mode]["output_tokens"] > 0
        assert 0 < w["kv_utilization"] <= 1 and 0 < w["forward_fraction"] <= 1
        assert w["modes"]["continuous"]["output_tokens"] == w["modes"]["static"]["output_tokens"]
        assert w["modes"]["static"]["output_tokens"] == w["modes"]["static_unpadded"]["output_tokens"]
    assert png.stat().st_size > 10_000
    table = capsys.readouterr().out
    assert "continuous" in table and "kv_utilization=" in table and "forward_fraction=" in table
    assert "static: rectangular batches" in table and "static_unpadded: the same batches" in table


def test_static_batches_are_rectangles() -> None:
    from flotilla_server.bench.offline import left_padded

    assert left_padded([[5, 6], [7], [1, 2, 3]], 0) == [[0, 5, 6], [0, 0, 7], [1, 2, 3]]
    assert left_padded([[4]], 9) == [[4]]


def test_offline_refuses_an_unknown_workload_size(capsys) -> None:
    assert main(["offline", "--quick", "--workload", "llama-100m"]) == 2
    assert "not part of --quick" in capsys.readouterr().err


def test_kv_utilization_and_forward_fraction_use_only_the_steps_they_name() -> None:
    from flotilla_server.bench.offline import forward_fraction, kv_utilization
    from flotilla_server.engine.outputs import StepRecord

    def rec(running, waiting, held, allocated, decode, prefill_seqs, fwd, dur):
        return StepRecord(dur, fwd, decode, 0, decode, num_prefill_seqs=prefill_seqs, num_running=running,
                          num_waiting=waiting, kv_positions_held=held, kv_positions_allocated=allocated)

    steps = [
        rec(4, 3, 90, 100, 4, 0, 0.9, 1.0),  # saturated (waiting), full batch
        rec(4, 0, 80, 100, 3, 1, 0.5, 1.0),  # saturated (all slots), full batch
        rec(2, 0, 10, 100, 2, 0, 0.1, 1.0),  # neither
    ]
    assert kv_utilization(steps, 4) == (pytest.approx(0.85), 2)
    assert forward_fraction(steps, 4) == (pytest.approx(0.7), 2)
    assert kv_utilization(steps[2:], 4) == (None, 0) and forward_fraction(steps[2:], 4) == (None, 0)
