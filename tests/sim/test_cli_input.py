"""`flotilla-sim` refuses bad input before it simulates anything: one line on stderr that names the problem
and the fix, exit status 2, no traceback (docs/simulation.md, "Bad input").

The numeric flags are found from the parser itself, so a flag added tomorrow is checked at 0 and -1 the day
it lands. Flag checks call `parse_args`, the first thing `main` does, so a check that wrongly passes fails
the test rather than starting a fleet-day run. Two subprocess runs prove the console script prints no
traceback; the rest run in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flotilla_sim import cli

# the least each subcommand needs to parse; the flag under test comes after, so it overrides (--rate)
BASE_ARGS = {"fleet": [], "trace": ["t.csv"], "generate": ["poisson", "--rate", "1", "-o", "t.csv"], "adapters": []}
# flags at which 0 is a meaningful value, and why
ZERO_IS_VALID = {
    ("fleet", "--seed"): "a seed: numpy takes any whole number from 0, and 0 is the default",
    ("generate", "--seed"): "a seed: numpy takes any whole number from 0, and 0 is the default",
    ("adapters", "--seed"): "a seed: numpy takes any whole number from 0, and 0 is the default",
    ("fleet", "--drift-swap"): "the drifting day with no swap: a popular set that holds still",
    ("fleet", "--idle-h"): "the drifting day whose sleepers sleep 0 hours",
}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _is_numeric(action: argparse.Action) -> bool:
    """A flag whose type turns "1" into a number: plain int/float as much as the checked types."""
    if action.type is None or not action.option_strings:
        return False
    try:
        value = action.type("1")
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return isinstance(value, int | float) and not isinstance(value, bool)


NUMERIC_FLAGS = sorted((name, action.option_strings[-1], action.dest)
                       for name, sub in _subcommands().items() for action in sub._actions if _is_numeric(action))


def _refused(capsys, argv: list[str], run=cli.main) -> str:
    """The one line `argv` printed on stderr; fails unless it exited 2 with one line and no traceback."""
    with pytest.raises(SystemExit) as stopped:
        run(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    assert err.startswith("flotilla-sim"), err
    return err


def test_the_finder_finds_the_numeric_flags_of_every_subcommand():
    found = {(name, flag) for name, flag, _ in NUMERIC_FLAGS}
    assert {("fleet", "--models"), ("fleet", "--gpus"), ("fleet", "--seed"), ("trace", "--tick-s"),
            ("trace", "--interval-s"), ("trace", "--jobs"), ("generate", "--rate"), ("generate", "--duration-s"),
            ("generate", "--prompt-tokens")} <= found
    assert set(ZERO_IS_VALID) <= found  # no stale exemption
    assert len(found) >= 17  # 6 of fleet, 3 of trace, 8 of generate when written


@pytest.mark.parametrize("value", ["0", "-1"])
@pytest.mark.parametrize(("command", "flag", "dest"), NUMERIC_FLAGS, ids=[f"{c} {f}" for c, f, _ in NUMERIC_FLAGS])
def test_every_numeric_flag_is_refused_at_0_and_below(command, flag, dest, value, capsys):
    argv = [command, *BASE_ARGS[command], flag, value]
    if value == "0" and (command, flag) in ZERO_IS_VALID:
        assert getattr(cli.build_parser().parse_args(argv), dest) == 0
        return
    err = _refused(capsys, argv, cli.build_parser().parse_args)
    assert f"argument {flag}" in err and f"'{value}'" in err and ("or more" in err or "above 0" in err)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--idle-share", "-0.1", "must be a share, 0 or more and under 1"),
    ("--idle-share", "1", "must be a share, 0 or more and under 1"),
    ("--idle-share", "nan", "must be a share, 0 or more and under 1"),
    ("--idle-h", "24", "must be hours of a day, 0 or more and under 24"),
    ("--idle-h", "-1", "must be hours of a day, 0 or more and under 24"),
])
def test_the_drifting_days_shares_and_hours_are_refused_out_of_range(flag, value, message, capsys):
    err = _refused(capsys, ["fleet", "--workload", "drifting", flag, value], cli.build_parser().parse_args)
    assert f"argument {flag}: {message}, not '{value}'" in err


def test_a_drift_swap_past_half_the_catalogue_is_refused(capsys, tmp_path):
    err = _refused(capsys, ["fleet", "--workload", "drifting", "--models", "10", "--gpus", "20", "--drift-swap", "6",
                            "--out", str(tmp_path)])
    assert "--drift-swap must be between 0 and half the catalogue (5), got 6" in err


@pytest.mark.parametrize("flag", ["--models", "--gpus"])
def test_the_issue_s_negative_sizes_are_refused(flag, capsys):
    err = _refused(capsys, ["fleet", flag, "-5"])
    assert f"argument {flag}: must be a whole number, 1 or more, not '-5'" in err


def test_a_fleet_with_no_more_gpus_than_models_is_refused(capsys, tmp_path):
    err = _refused(capsys, ["fleet", "--models", "10", "--gpus", "10", "--out", str(tmp_path)])
    assert "--gpus 10 is not more than --models 10" in err and "raise --gpus or lower --models" in err


@pytest.mark.parametrize("policies", ["nonesuch", "latency-first,nonesuch", ","])
def test_an_unknown_or_empty_policy_list_is_refused(policies, capsys):
    err = _refused(capsys, ["trace", "t.csv", "--policies", policies])
    assert "argument --policies" in err and "pass all, or a comma-separated list from latency-first" in err


def test_the_pool_is_refused_at_request_level_by_name(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens\n0.5,0,10,5\n")
    err = _refused(capsys, ["trace", str(trace), "--fidelity", "request", "--policies", "keda,cost-first-pool",
                            "--out", str(tmp_path / "out")])
    assert "cost-first-pool runs in the fluid mode only" in err and "--fidelity fluid" in err


def test_a_missing_trace_file_is_named(capsys, tmp_path):
    err = _refused(capsys, ["trace", str(tmp_path / "no-such.csv"), "--out", str(tmp_path / "out")])
    assert f"cannot read {tmp_path / 'no-such.csv'} (No such file or directory)" in err
    assert "flotilla-sim generate writes one" in err


def test_a_wrong_header_prints_the_header_found_and_the_one_expected(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("time,model,prompt,output\n0.5,0,10,5\n")
    err = _refused(capsys, ["trace", str(trace), "--out", str(tmp_path / "out")])
    assert "the header is 'time,model,prompt,output', which lacks arrival_s, prompt_tokens, output_tokens" in err
    assert "the first line must be arrival_s,model,prompt_tokens,output_tokens" in err


@pytest.mark.parametrize(("body", "expected"), [
    ("", "is empty"),
    ("arrival_s,model,prompt_tokens,output_tokens\n", "holds no requests"),
    ("arrival_s,model,prompt_tokens,output_tokens\n0.5,0,10,5\n1.0,zero,10,5\n", "line 3: '1.0,zero,10,5' is not 4 numbers"),
    ("arrival_s,model,prompt_tokens,output_tokens\n0.5,0,10\n", "line 2: '0.5,0,10' is not 4 numbers"),
    ("arrival_s,model,prompt_tokens,output_tokens\n-1,0,10,5\n", "line 2: arrival_s is -1; it must be seconds"),
    ("arrival_s,model,prompt_tokens,output_tokens\nnan,0,10,5\n", "line 2: arrival_s is nan"),
    ("arrival_s,model,prompt_tokens,output_tokens\n0.5,-1,10,5\n", "line 2: model is -1"),
    ("arrival_s,model,prompt_tokens,output_tokens\n0.5,1.5,10,5\n", "line 2: model is 1.5"),
    ("arrival_s,model,prompt_tokens,output_tokens\n0.5,0,0,5\n", "line 2: prompt_tokens is 0; it must be a whole number of tokens from 1"),
    ("arrival_s,model,prompt_tokens,output_tokens\n0.5,0,10,5\n\n1,0,1,0\n", "line 4: output_tokens is 0"),
])
def test_a_bad_trace_row_is_refused_with_its_line(body, expected, capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(body)
    err = _refused(capsys, ["trace", str(trace), "--out", str(tmp_path / "out")])
    assert expected in err and str(trace) in err


def test_a_missing_traces_directory_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOTILLA_TRACES", "/nonexistent")
    err = _refused(capsys, ["fleet", "--models", "2", "--gpus", "4", "--out", str(tmp_path)])
    assert "FLOTILLA_TRACES=/nonexistent is not a directory" in err and "or unset it" in err


def test_a_traces_directory_without_the_trace_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOTILLA_TRACES", str(tmp_path))
    err = _refused(capsys, ["fleet", "--trace", "code", "--models", "2", "--gpus", "4", "--out", str(tmp_path)])
    assert "azure-llm-2023-code.csv" in err and "unset FLOTILLA_TRACES" in err


def _bench_dir(tmp_path: Path, text: str) -> Path:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "online-c1.json").write_text(text)
    return tmp_path / "bench"


@pytest.mark.parametrize(("content", "expected"), [
    (None, "is not a directory"),
    ("{not json", "is not readable JSON"),
    (json.dumps({"summary": {}}), "is not a flotilla-bench result (KeyError: 'config')"),
    (json.dumps({"summary": {"config": {"model": "m", "concurrency": 4}, "tpot_ms": {"p50": 2.0}}}),
     "holds 1 flotilla-bench step-time results"),
])
def test_a_bad_profile_directory_is_refused(content, expected, capsys, tmp_path):
    profile = tmp_path / "no-such-dir" if content is None else _bench_dir(tmp_path, content)
    err = _refused(capsys, ["trace", "t.csv", "--profile", str(profile)])
    assert "argument --profile" in err and expected in err and "roofline" in err


def test_generate_refuses_an_empty_trace_and_an_unwritable_output(capsys, tmp_path):
    err = _refused(capsys, ["generate", "poisson", "--rate", "0.0001", "--duration-s", "1", "-o", str(tmp_path / "t.csv")])
    assert "no request arrived in 1 s" in err and not (tmp_path / "t.csv").exists()
    err = _refused(capsys, ["generate", "poisson", "--rate", "5", "--duration-s", "2", "-o", str(tmp_path / "no" / "t.csv")])
    assert f"-o {tmp_path / 'no' / 't.csv'} cannot be written" in err


def test_an_out_path_that_cannot_be_a_directory_is_refused_before_the_run(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens\n0.5,0,10,5\n")
    err = _refused(capsys, ["trace", str(trace), "--out", str(tmp_path / "file" / "out")])
    assert "cannot be created" in err and "pass a writable directory" in err


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "flotilla-sim"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flotilla_sim.cli"]


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["fleet", "--gpus", "-100"], {}, "argument --gpus"),
    (["fleet", "--models", "2", "--gpus", "4"], {"FLOTILLA_TRACES": "/nonexistent"}, "FLOTILLA_TRACES"),
], ids=["parser", "command"])
def test_the_console_script_prints_one_line_and_no_traceback(argv, env, expected, tmp_path):
    done = subprocess.run([*_console_script(), *argv, "--out", str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and expected in done.stderr and "Traceback" not in done.stderr
