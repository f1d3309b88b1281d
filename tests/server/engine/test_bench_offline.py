"""`flotilla-bench offline --quick`: the smoke run writes the documented fields, a table and a plot."""

from __future__ import annotations

import json

from flotilla_server.bench.cli import main


def test_offline_quick_smoke(tmp_path, capsys) -> None:
    out, png = tmp_path / "offline.json", tmp_path / "offline.png"
    assert main(["offline", "--quick", "--threads", "1", "--json", str(out), "--plot", str(png)]) == 0
    report = json.loads(out.read_text())
    assert set(report["workloads"]) == {"tiny", "llama-small"}
    for w in report["workloads"].values():
        for mode in ("continuous", "static", "sequential", "transformers"):
            assert w["modes"][mode]["output_tokens_per_s"] > 0
            assert w["modes"][mode]["output_tokens"] > 0
        assert 0 < w["kv_utilization"] <= 1 and 0 < w["forward_fraction"] <= 1
        assert w["modes"]["continuous"]["output_tokens"] == w["modes"]["static"]["output_tokens"]
    assert png.stat().st_size > 10_000
    table = capsys.readouterr().out
    assert "continuous" in table and "kv_utilization=" in table and "forward_fraction=" in table


def test_offline_refuses_an_unknown_workload_size(capsys) -> None:
    assert main(["offline", "--quick", "--workload", "llama-100m"]) == 2
    assert "not part of --quick" in capsys.readouterr().err
