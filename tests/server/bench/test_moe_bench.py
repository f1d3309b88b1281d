"""`flotilla-bench moe`: the dense model has the MoE model's parameter count, a small run measures every (round,
model, clients) with the models' order alternating, and the report's summary, bars and plot come from its runs."""

from __future__ import annotations

import argparse
import json

from flotilla_server.bench.cli import main
from flotilla_server.bench.moe import CLIENTS, add_arguments, measure, model_configs, summarize
from flotilla_server.bench.moe_plot import plot_moe
from flotilla_server.model_cache.footprint import parameter_count

SMALL = ["--hidden", "64", "--layers", "2", "--experts", "8", "--top-k", "2", "--expert-width", "32",
         "--prompt-tokens", "4", "--max-tokens", "3", "--rounds", "2"]


def args_of(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_default_dense_model_has_the_moe_models_parameters_to_a_row():
    args = args_of()
    configs = model_configs(args)
    moe, dense = configs["moe"], configs["dense"]
    assert moe.model_type == "qwen3_moe" and moe.qk_norm and all(moe.is_sparse(i) for i in range(args.layers))
    assert dense.moe is None and dense.intermediate_size > 30 * args.expert_width
    assert abs(parameter_count(moe) - parameter_count(dense)) <= 3 * args.hidden * args.layers / 2


def test_a_small_run_measures_every_round_model_and_client_count(tmp_path):
    result = measure(args_of(*SMALL), "native", lambda _: None)
    assert [(r["round"], r["model"], r["clients"]) for r in result["runs"]] == [
        (1, "moe", 1), (1, "moe", 16), (1, "dense", 1), (1, "dense", 16),
        (2, "dense", 1), (2, "dense", 16), (2, "moe", 1), (2, "moe", 16)]
    assert all(r["output_tokens"] == 3 * r["clients"] and r["tokens_per_s"] > 0 for r in result["runs"])
    assert result["models"]["moe"]["parameters"] - result["models"]["dense"]["parameters"] <= 3 * 64 * 2
    summary = summarize({"native": result})["native"]
    assert set(summary["ratio"]) == {str(c) for c in CLIENTS}
    report = {"config": vars(args_of(*SMALL)), "bars": {"1": 1.5, "16": 0.8}, "cpu": {"model_name": "test"},
              "summary": {"native": summary}, "results": {"native": result}}
    plot_moe(report, tmp_path / "moe.png")
    assert (tmp_path / "moe.png").stat().st_size > 0


def test_the_command_runs_its_isa_in_a_child_and_writes_the_report(tmp_path, capsys):
    assert main(["moe", *SMALL, "--rounds", "1", "--json", str(tmp_path / "moe.json")]) == 0
    report = json.loads((tmp_path / "moe.json").read_text())
    assert set(report["results"]) == {"native"} and len(report["results"]["native"]["runs"]) == 4
    assert "cpu" in report and "1 client: MoE" in capsys.readouterr().out
