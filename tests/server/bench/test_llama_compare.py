"""`flotilla-bench llamacpp`'s pure parts: option checks, medians, ratios, targets, the table and the CPU named.
No llama-server is started (docs/benchmarks.md, "Against llama.cpp", has the real run)."""

from __future__ import annotations

import argparse

import pytest
from flotilla_server.bench.cli import main
from flotilla_server.bench.llama_compare import (
    ISA_ENV,
    _server_command,
    add_arguments,
    check_args,
    default_requests_per_client,
)
from flotilla_server.bench.llama_compare_report import (
    markdown_table,
    median_table,
    parse_lscpu,
    ratio_table,
    targets,
)


def parse(*argv: str, model) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--model", str(model), *argv])
    args.clients = sorted(set(args.clients or [1, 16]))
    return args


def row(isa: str, server: str, clients: int, tps: float, rnd: int = 1) -> dict:
    return {"isa": isa, "server": server, "clients": clients, "round": rnd, "tokens_per_s": tps}


def test_defaults_and_bad_options(tmp_path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    args = parse(model=model)
    assert (args.isa, args.clients, args.rounds, args.max_tokens, args.with_float32, args.flotilla_threads) == (
        "both", [1, 16], 3, 64, True, "same")
    assert check_args(args, cpus=2) is None
    assert "--rounds must be >= 1" in check_args(parse("--rounds", "0", model=model), cpus=2)
    assert "--clients" in check_args(parse("--clients", "0", model=model), cpus=2)
    assert "--threads must be <= 2" in check_args(parse("--threads", "3", model=model), cpus=2)
    assert "--max-tokens" in check_args(parse("--max-tokens", "1000", model=model), cpus=2)
    assert "is not a file" in check_args(parse(model=tmp_path / "missing.gguf"), cpus=2)
    assert not parse("--no-with-float32", model=model).with_float32
    assert [default_requests_per_client(c) for c in (1, 16)] == [4, 2]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert main(["llamacpp", "--model", str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("flotilla-bench llamacpp: --model")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert main(["llamacpp", "--model", str(model), "--rounds", "0"]) == 2
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err


def test_both_servers_get_the_same_threads_and_slots(tmp_path) -> None:
    args = parse(model=tmp_path / "m.gguf")
    peer = _server_command("llama-server", args, 8080, 2, tmp_path / "llama-server")
    assert peer[peer.index("--parallel") + 1] == "16" and peer[peer.index("-c") + 1] == str(16 * 512)
    assert peer[peer.index("-t") + 1] == peer[peer.index("-tb") + 1] == "2"
    ours = _server_command("flotilla-float32", args, 8081, 2, tmp_path / "llama-server")
    assert ours[ours.index("--quantization") + 1] == "none" and ours[ours.index("--max-num-seqs") + 1] == "16"
    assert set(ISA_ENV) == {"ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS",
                            "FLOTILLA_KERNEL_ISA"}


def test_medians_ratios_and_targets() -> None:
    runs = [row("native", "flotilla", 1, v, i) for i, v in enumerate((90, 100, 300))]
    runs += [row("native", "llama-server", 1, v, i) for i, v in enumerate((125, 120, 130))]
    runs += [row("native", "flotilla", 16, 400), row("native", "flotilla-float32", 16, 500),
             row("native", "llama-server", 16, 320)]
    medians = median_table(runs)
    assert medians["native"]["flotilla"] == {"1": 100, "16": 400}  # the median, not the mean (163)
    ratios = ratio_table(medians)
    assert ratios["native"]["1"] == {"flotilla/llama-server": pytest.approx(100 / 125)}
    assert ratios["native"]["16"] == pytest.approx({"flotilla/llama-server": 1.25, "flotilla-float32/llama-server":
                                                    500 / 320, "flotilla/flotilla-float32": 0.8})
    met = {(t["clients"], t["ratio"]): t["met"] for t in targets(ratios)}
    assert met == {(1, "flotilla/llama-server"): False, (16, "flotilla/llama-server"): True,
                   (16, "flotilla/flotilla-float32"): False}
    table = markdown_table(medians, ratios).splitlines()
    assert table[2] == "| native | 1 | 100.0 | – | 125.0 | 0.80x | – |"
    assert table[3] == "| native | 16 | 400.0 | 500.0 | 320.0 | 1.25x | 1.56x |"


def test_lscpu_names_the_cpu_and_its_wide_paths() -> None:
    text = ("Model name:   Intel(R) Xeon(R) Processor\nCPU family:   6\nModel:        167\n"
            "Flags:        fpu avx2 avx512f avx512_vnni amx_tile amx_int8\n")
    assert parse_lscpu(text) == {"model_name": "Intel(R) Xeon(R) Processor", "family": "6", "model": "167",
                                 "avx512f": True, "avx512_vnni": True, "amx": True, "avx2": True}
    assert parse_lscpu("Flags: fpu avx2\n")["avx512f"] is False
