"""LoRA adapter routing in the simulator (flotilla_sim/adapters.py): the gateway's rule, imported unchanged,
against always-the-holder and spread-by-load on the Azure conversation trace's first 20 minutes with
Zipf-popular adapters: the rule's hot spots are lower than the holder policy's and its adapter loads far
fewer than spreading's, and a pod that joins takes requests in its first minute."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flotilla_gateway import adapter_routing
from flotilla_sim import adapters, cli, workload
from flotilla_sim.workload import make_trace


@pytest.fixture(scope="module")
def runs():
    full = workload.read_azure("conv")
    keep = full.arrival_s < 1200
    trace = make_trace(full.arrival_s[keep], full.model[keep], full.prompt_tokens[keep], full.output_tokens[keep])
    drawn = adapters.zipf_adapters(len(trace), 64, 1.0, np.random.default_rng(0))
    return {p: adapters.run(trace, drawn, p, pods=4, slots=16, max_loras=8, tpot_s=0.03, scale_up_at_s=600.0)
            for p in adapters.POLICIES}


def test_the_rule_sits_between_pinning_and_spreading(runs):
    rule, holder, spread = runs["rule"], runs["holder"], runs["spread"]
    assert rule.hot_spot_mean < holder.hot_spot_mean  # a hot adapter is not pinned to one pod
    assert rule.adapter_loads_per_hour < 0.5 * spread.adapter_loads_per_hour  # and pods do not thrash
    assert rule.latency_p95_s <= holder.latency_p95_s


def test_a_pod_that_joins_takes_adapter_traffic_in_its_first_minute(runs):
    rule = runs["rule"]
    assert rule.new_pod_share is not None and rule.new_pod_share >= 0.25 * rule.fair_share


def test_the_simulator_routes_with_the_gateway_s_own_function():
    assert adapters.choose_for_adapter is adapter_routing.choose_for_adapter


def test_the_command_writes_its_table_and_json(tmp_path, capsys):
    cli.main(["adapters", "--adapters", "16", "--pods", "2", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "adapters.json").read_text())
    assert [r["policy"] for r in report["runs"]] == list(adapters.POLICIES)
    assert report["config"]["adapters"] == 16
    assert "| rule |" in capsys.readouterr().out and (tmp_path / "adapters.md").is_file()


def test_more_slots_than_adapters_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["adapters", "--adapters", "4", "--max-loras", "8", "--out", str(tmp_path)])
    assert done.value.code == 2
    assert "--max-loras 8 is more than --adapters 4" in capsys.readouterr().err
