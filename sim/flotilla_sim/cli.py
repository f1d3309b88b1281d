"""`flotilla-sim`: run the six policies on a fleet day, on a trace file, or write a synthetic trace.

  flotilla-sim fleet --models 1000 --gpus 10000 --out docs/sim     one Azure-trace day, fluid mode
  flotilla-sim trace FILE --fidelity request --out /tmp/sim         a trace file (docs/simulation.md)
  flotilla-sim generate diurnal --rate 20 --models 10 --duration-s 3600 -o trace.csv
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

from flotilla_sim import experiment, policies, report, request_level, workload
from flotilla_sim.server_model import fit_bench, roofline


def _profile(name: str):
    return roofline() if name == "roofline" else fit_bench(name)


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(n for n in text.split(",") if n) if text != "all" else policies.ALL
    unknown = set(names) - set(policies.ALL)
    if unknown:
        raise SystemExit(f"unknown policies {sorted(unknown)}; choose from {', '.join(policies.ALL)}")
    return names


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
    profile = _profile(args.profile)
    base = workload.read_azure(args.trace)
    scenario = experiment.fleet_scenario(base, args.models, args.gpus, args.tick_s, args.interval_s,
                                         profile, args.seed, args.trace)
    print(f"{scenario.notes['requests']:,.0f} requests over {args.models} models, rate x{scenario.notes['rate_scale']:.1f}",
          file=sys.stderr)
    results = experiment.run_policies(scenario, _policies(args.policies), show_progress=not args.quiet, jobs=args.jobs)
    _finish(results, scenario.notes, profile.source, Path(args.out), scenario.name, started)


def cmd_trace(args: argparse.Namespace) -> None:
    started = time.monotonic()
    profile = _profile(args.profile)
    trace = workload.read_trace(args.file)
    names = _policies(args.policies)
    notes = {"trace": str(args.file), "requests": len(trace), "fidelity": args.fidelity,
             "autoscale_interval_s": args.interval_s}
    if args.fidelity == "request":
        results = {n: request_level.run_policy(trace, profile, n, args.interval_s) for n in names}
    else:
        work = workload.bin_trace(trace, args.tick_s)
        scenario = experiment.Scenario(Path(args.file).stem, work, profile, args.interval_s, notes)
        results = experiment.run_policies(scenario, names, show_progress=not args.quiet, jobs=args.jobs)
    _finish(results, notes, profile.source, Path(args.out), f"{Path(args.file).stem}-{args.fidelity}", started)


def cmd_generate(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    if args.kind == "poisson":
        times = workload.poisson(args.rate, args.duration_s, rng)
    elif args.kind == "onoff":
        times = workload.on_off(args.rate, args.on_s, args.off_s, args.duration_s, rng)
    else:
        times = workload.diurnal(args.rate, args.duration_s, rng)
    trace = workload.synthetic(times, args.models, rng, args.prompt_tokens, args.output_tokens)
    workload.write_trace(trace, args.output)
    print(f"wrote {len(trace)} requests over {args.models} models to {args.output}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flotilla-sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile", default="roofline",
                        help="'roofline' (an H100 model, not a measurement) or a directory of flotilla-bench JSON")
    common.add_argument("--policies", default="all", help=f"comma-separated, from {', '.join(policies.ALL)}")
    common.add_argument("--interval-s", type=float, default=15.0, help="autoscaler interval")
    common.add_argument("--tick-s", type=float, default=5.0, help="fluid mode's tick")
    common.add_argument("--out", default="sim-out", help="directory for JSON, PNG and Markdown")
    common.add_argument("--quiet", action="store_true", help="no progress bar")
    common.add_argument("--jobs", type=int, default=1, help="policies run in this many processes (fluid mode)")
    fleet = sub.add_parser("fleet", parents=[common], help="a day of an Azure trace over a Zipf catalogue")
    fleet.add_argument("--trace", choices=("conv", "code"), default="conv")
    fleet.add_argument("--models", type=int, default=1000)
    fleet.add_argument("--gpus", type=int, default=10000, help="static provisioning at peak needs this many")
    fleet.add_argument("--seed", type=int, default=0)
    fleet.set_defaults(func=cmd_fleet)
    trace = sub.add_parser("trace", parents=[common], help="a trace file in the documented CSV format")
    trace.add_argument("file")
    trace.add_argument("--fidelity", choices=("fluid", "request"), default="fluid")
    trace.set_defaults(func=cmd_trace)
    gen = sub.add_parser("generate", help="write a synthetic trace")
    gen.add_argument("kind", choices=("poisson", "onoff", "diurnal"))
    gen.add_argument("--rate", type=float, required=True, help="requests/s (peak for diurnal, on-rate for onoff)")
    gen.add_argument("--models", type=int, default=10)
    gen.add_argument("--duration-s", type=float, default=3600.0)
    gen.add_argument("--on-s", type=float, default=60.0)
    gen.add_argument("--off-s", type=float, default=240.0)
    gen.add_argument("--prompt-tokens", type=int, default=512)
    gen.add_argument("--output-tokens", type=int, default=128)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("-o", "--output", required=True)
    gen.set_defaults(func=cmd_generate)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
