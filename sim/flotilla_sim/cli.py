"""`flotilla-sim`: run the policies on a fleet day, on a trace file, or write a synthetic trace.

  flotilla-sim fleet --models 1000 --gpus 10000 --out docs/sim     one Azure-trace day, fluid mode
  flotilla-sim trace FILE --fidelity request --out /tmp/sim         a trace file (docs/simulation.md)
  flotilla-sim generate diurnal --rate 20 --models 10 --duration-s 3600 -o trace.csv
  flotilla-sim adapters --adapters 64 --pods 4 --out docs/sim      LoRA adapter routing policies compared

A bad flag, file or $FLOTILLA_TRACES stops the command before it simulates anything, with one line on
stderr saying what to change and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
from flotilla_contract.one_line_parser import OneLineParser
from flotilla_operator.slo_scaler import SloTargets

from flotilla_sim import adapters, experiment, policies, report, request_level, workload
from flotilla_sim.drift import DriftSpec
from flotilla_sim.errors import InputError
from flotilla_sim.server_model import ServerProfile, fit_bench, roofline
from flotilla_sim.slo_policies import DEFAULT_SLO

# --- argument types: the parser refuses a value out of range before anything runs -----------------------


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"must be a whole number, {least} or more, not {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count or a size: 0 models, GPUs, tokens or processes would simulate nothing."""
    return _whole(text, 1)


def non_negative_int(text: str) -> int:
    """A seed: numpy takes any whole number from 0 (the default) up."""
    return _whole(text, 0)


def _bounded(text: str, below: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value < below):
        raise argparse.ArgumentTypeError(f"must be {what}, 0 or more and under {below:g}, not {text!r}")
    return value


def share(text: str) -> float:
    """A share of the catalogue: 0 (none) up to, not including, 1."""
    return _bounded(text, 1.0, "a share")


def hours_of_a_day(text: str) -> float:
    """A stretch of a day in hours: 0 up to, not including, 24."""
    return _bounded(text, 24.0, "hours of a day")


def positive_float(text: str) -> float:
    """A rate or a duration: finite and above 0 (a 0 s tick or interval never advances)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text!r}")
    return value


def policy_names(text: str) -> tuple[str, ...]:
    """'all', or comma-separated policy names: at least one, each one of policies.ALL."""
    names = policies.ALL if text == "all" else tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in policies.ALL]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r} names {'no policy' if not names else 'unknown ' + ', '.join(unknown)}; "
                                         f"pass all, or a comma-separated list from {', '.join(policies.ALL)}")
    return names


def percentile(text: str) -> float:
    """A percentile as a fraction: strictly between 0 and 1 (0.9 is the p90)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction strictly between 0 and 1 (0.9 for the p90), not {text!r}")
    return value


def slo_targets(args: argparse.Namespace) -> SloTargets:
    """The SLO the two SLO policies hold, from --slo-ttft-s, --slo-tpot-s and --slo-percentile."""
    return SloTargets(ttft_s=args.slo_ttft_s, tpot_s=args.slo_tpot_s, ttft_percentile=args.slo_percentile,
                      tpot_percentile=args.slo_percentile, window_s=DEFAULT_SLO.window_s)


def server_profile(text: str) -> ServerProfile:
    """'roofline', or a directory of flotilla-bench JSON to fit (server_model.fit_bench)."""
    if text == "roofline":
        return roofline()
    try:
        return fit_bench(text)
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _out_dir(text: str) -> Path:
    """--out, created now: a path that cannot be written fails before the run, not after it."""
    out = Path(text)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"--out {text} cannot be created ({error.strerror}); pass a writable directory") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise InputError(f"--out {text} is not writable; pass a writable directory")
    return out


def _finish(results: dict, notes: dict, source: str, out: Path, name: str, started: float) -> None:
    notes["wall_s"] = time.monotonic() - started
    # the largest process: this one, or the largest forked worker (--jobs); Linux reports KiB
    notes["peak_rss_bytes"] = 1024 * max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                         resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    paths = report.write(results, notes, source, out, name)
    print(report.markdown(results, notes, source))
    print(f"wall {notes['wall_s']:.1f} s, peak memory {notes['peak_rss_bytes'] / 2**20:,.0f} MiB; "
          f"wrote {', '.join(str(p) for p in paths.values())}")


def cmd_fleet(args: argparse.Namespace) -> None:
    started = time.monotonic()
    if args.gpus <= args.models:
        # static provisioning at peak gives every model a GPU: the sizing rule needs GPUs to spare
        raise InputError(f"--gpus {args.gpus} is not more than --models {args.models}: static provisioning at "
                         "peak gives every model at least one GPU, so no load would be left to size; "
                         "raise --gpus or lower --models")
    out = _out_dir(args.out)
    base = workload.read_azure(args.trace)
    drift = None
    if args.workload == "drifting":
        drift = DriftSpec(args.drift_every_h, args.drift_swap, args.idle_share, args.idle_h)
        drift.check(args.models)
    scenario = experiment.fleet_scenario(base, args.models, args.gpus, args.tick_s, args.interval_s,
                                         args.profile, args.seed, args.trace, slo_targets(args), drift)
    print(f"{scenario.notes['requests']:,.0f} requests over {args.models} models, rate x{scenario.notes['rate_scale']:.1f}",
          file=sys.stderr)
    results = experiment.run_policies(scenario, args.policies, show_progress=not args.quiet,
                                      jobs=min(args.jobs, len(args.policies)))
    _finish(results, scenario.notes, args.profile.source, out, scenario.name, started)


def _request_level(names: tuple[str, ...]) -> tuple[str, ...]:
    """The policies the request level runs: 'all' leaves out those with a shared pool (fluid mode only), a
    list naming one is refused."""
    only = ", ".join(policies.FLUID_ONLY)
    if names == policies.ALL:
        print(f"{only} run in the fluid mode only: left out", file=sys.stderr)
        return request_level.REQUEST_LEVEL_POLICIES
    named = [n for n in names if n in policies.FLUID_ONLY]
    if named:
        raise InputError(f"{', '.join(named)} runs in the fluid mode only; drop it from --policies, "
                         "or pass --fidelity fluid")
    return names


def cmd_trace(args: argparse.Namespace) -> None:
    started = time.monotonic()
    names = _request_level(args.policies) if args.fidelity == "request" else args.policies
    out = _out_dir(args.out)
    trace = workload.read_trace(args.file)
    slo = slo_targets(args)
    notes = {"trace": str(args.file), "requests": len(trace), "fidelity": args.fidelity,
             "autoscale_interval_s": args.interval_s, "slo": experiment.slo_notes(slo)}
    if args.fidelity == "request":
        results = {n: request_level.run_policy(trace, args.profile, n, args.interval_s, slo=slo) for n in names}
    else:
        work = workload.bin_trace(trace, args.tick_s)
        scenario = experiment.Scenario(Path(args.file).stem, work, args.profile, args.interval_s, notes, slo)
        results = experiment.run_policies(scenario, args.policies, show_progress=not args.quiet,
                                          jobs=min(args.jobs, len(args.policies)))
    _finish(results, notes, args.profile.source, out, f"{Path(args.file).stem}-{args.fidelity}", started)


def cmd_generate(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    if args.kind == "poisson":
        times = workload.poisson(args.rate, args.duration_s, rng)
    elif args.kind == "onoff":
        times = workload.on_off(args.rate, args.on_s, args.off_s, args.duration_s, rng)
    else:
        times = workload.diurnal(args.rate, args.duration_s, rng)
    if len(times) == 0:  # an empty trace is refused by `flotilla-sim trace`: refuse to write one
        raise InputError(f"no request arrived in {args.duration_s:g} s at {args.rate:g} requests/s; "
                         "raise --rate or --duration-s")
    trace = workload.synthetic(times, args.models, rng, args.prompt_tokens, args.output_tokens)
    try:
        workload.write_trace(trace, args.output)
    except OSError as error:
        raise InputError(f"-o {args.output} cannot be written ({error.strerror}); "
                         "pass a file path in a writable directory") from None
    print(f"wrote {len(trace)} requests over {args.models} models to {args.output}")


def cmd_adapters(args: argparse.Namespace) -> None:
    """The adapter routing policies (sim/flotilla_sim/adapters.py) on one trace, Zipf adapters drawn once."""
    out = _out_dir(args.out)
    trace = workload.read_azure(args.trace)
    if args.max_loras > args.adapters:
        raise InputError(f"--max-loras {args.max_loras} is more than --adapters {args.adapters}: every pod would "
                         "hold every adapter; raise --adapters or lower --max-loras")
    drawn = adapters.zipf_adapters(len(trace), args.adapters, args.zipf, np.random.default_rng(args.seed))
    scale_up_at_s = float(trace.arrival_s[-1]) / 2 if args.scale_up else None
    runs = [adapters.run(trace, drawn, policy, args.pods, args.slots, args.max_loras, args.tpot_ms / 1000,
                         scale_up_at_s) for policy in adapters.POLICIES]
    table = adapters.markdown(runs)
    config = {k: getattr(args, k) for k in ("trace", "adapters", "zipf", "pods", "slots", "max_loras", "tpot_ms",
                                            "scale_up", "seed")}
    (out / "adapters.json").write_text(adapters.to_json(config, runs))
    (out / "adapters.md").write_text(table)
    print(table)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="flotilla-sim", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile", type=server_profile, default="roofline",
                        help="'roofline' (an H100 model, not a measurement) or a directory of flotilla-bench JSON")
    common.add_argument("--policies", type=policy_names, default="all",
                        help=f"'all' or comma-separated, from {', '.join(policies.ALL)}")
    common.add_argument("--interval-s", type=positive_float, default=15.0, help="autoscaler interval, seconds (above 0)")
    common.add_argument("--tick-s", type=positive_float, default=5.0, help="fluid mode's tick, seconds (above 0)")
    common.add_argument("--out", default="sim-out", help="directory for JSON, PNG and Markdown (created if missing)")
    common.add_argument("--quiet", action="store_true", help="no progress bar")
    common.add_argument("--jobs", type=positive_int, default=1,
                        help="policies run in this many processes (fluid mode; 1 or more)")
    common.add_argument("--slo-ttft-s", type=positive_float, default=DEFAULT_SLO.ttft_s,
                        help="the slo and llm-d policies' TTFT target, seconds (above 0)")
    common.add_argument("--slo-tpot-s", type=positive_float, default=DEFAULT_SLO.tpot_s,
                        help="their time-per-output-token target, seconds (above 0)")
    common.add_argument("--slo-percentile", type=percentile, default=DEFAULT_SLO.ttft_percentile,
                        help="the percentile both targets bound, between 0 and 1 (0.9: the p90)")
    fleet = sub.add_parser("fleet", parents=[common], help="a day of an Azure trace over a Zipf catalogue",
                           description="A day of an Azure LLM inference trace 2023 (shipped with flotilla-sim; "
                                       "$FLOTILLA_TRACES names another directory) over a Zipf catalogue.")
    fleet.add_argument("--trace", choices=("conv", "code"), default="conv",
                       help="the Azure trace: conversation or code service")
    fleet.add_argument("--models", type=positive_int, default=1000, help="catalogue size (1 or more)")
    fleet.add_argument("--gpus", type=positive_int, default=10000,
                       help="static provisioning at peak needs this many (more than --models)")
    fleet.add_argument("--seed", type=non_negative_int, default=0, help="seed of the arrivals (0 or more)")
    fleet.add_argument("--workload", choices=("day", "drifting"), default="day",
                       help="day: every model in a fixed Zipf order all day; drifting: the popular set drifts "
                            "and part of the catalogue sleeps (the --drift-* and --idle-* flags)")
    defaults = DriftSpec()
    fleet.add_argument("--drift-every-h", type=positive_float, default=defaults.drift_every_h,
                       help="drifting: hours between swaps of the popular set (above 0)")
    fleet.add_argument("--drift-swap", type=non_negative_int, default=defaults.drift_swap,
                       help="drifting: top ranks swapped with as many from the tail each time (0 to half the models)")
    fleet.add_argument("--idle-share", type=share, default=defaults.idle_share,
                       help="drifting: share of the catalogue idle for a stretch each day (0 or more, under 1)")
    fleet.add_argument("--idle-h", type=hours_of_a_day, default=defaults.idle_h,
                       help="drifting: hours each of those is idle (0 or more, under 24)")
    fleet.set_defaults(func=cmd_fleet)
    trace = sub.add_parser("trace", parents=[common], help="a trace file in the documented CSV format")
    trace.add_argument("file", help="CSV with the header arrival_s,model,prompt_tokens,output_tokens")
    trace.add_argument("--fidelity", choices=("fluid", "request"), default="fluid",
                       help="request: per request and step, up to ~20 models; fluid: per tick, for fleets")
    trace.set_defaults(func=cmd_trace)
    gen = sub.add_parser("generate", help="write a synthetic trace")
    gen.add_argument("kind", choices=("poisson", "onoff", "diurnal"))
    gen.add_argument("--rate", type=positive_float, required=True,
                     help="requests/s (peak for diurnal, on-rate for onoff; above 0)")
    gen.add_argument("--models", type=positive_int, default=10, help="catalogue size, Zipf popularity (1 or more)")
    gen.add_argument("--duration-s", type=positive_float, default=3600.0, help="trace length, seconds (above 0)")
    gen.add_argument("--on-s", type=positive_float, default=60.0, help="onoff: burst length, seconds (above 0)")
    gen.add_argument("--off-s", type=positive_float, default=240.0, help="onoff: silence length, seconds (above 0)")
    gen.add_argument("--prompt-tokens", type=positive_int, default=512, help="mean prompt length (1 or more)")
    gen.add_argument("--output-tokens", type=positive_int, default=128, help="mean output length (1 or more)")
    gen.add_argument("--seed", type=non_negative_int, default=0, help="seed of the draws (0 or more)")
    gen.add_argument("-o", "--output", required=True, help="the CSV to write")
    gen.set_defaults(func=cmd_generate)
    ad = sub.add_parser("adapters", help="LoRA adapter routing policies on an Azure trace with Zipf adapters",
                        description="The gateway's adapter rule against always-the-holder and spread-by-load: "
                                    "hot-spot ratio, adapter loads per hour, latency, and a mid-run pod's share.")
    ad.add_argument("--trace", choices=("conv", "code"), default="conv", help="the Azure trace's arrivals")
    ad.add_argument("--adapters", type=positive_int, default=64, help="adapters, Zipf-popular (1 or more)")
    ad.add_argument("--zipf", type=positive_float, default=1.0, help="Zipf exponent of adapter popularity (above 0)")
    ad.add_argument("--pods", type=positive_int, default=4, help="pods at the start (1 or more)")
    ad.add_argument("--slots", type=positive_int, default=16, help="requests a pod runs at once (1 or more)")
    ad.add_argument("--max-loras", type=positive_int, default=8, help="adapters a pod holds at once (1 or more)")
    ad.add_argument("--tpot-ms", type=positive_float, default=30.0, help="time per output token, ms (above 0)")
    ad.add_argument("--no-scale-up", dest="scale_up", action="store_false",
                    help="no pod joins half-way (by default one does)")
    ad.add_argument("--seed", type=non_negative_int, default=0, help="seed of the adapter draws (0 or more)")
    ad.add_argument("--out", default="sim-out", help="directory for adapters.json and adapters.md")
    ad.set_defaults(func=cmd_adapters)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except InputError as error:
        message = " ".join(str(error).splitlines())  # one line, whatever a path or a header held
        parser.exit(2, f"flotilla-sim {args.command}: error: {message}\n")


if __name__ == "__main__":
    main()
