#!/usr/bin/env bash
# `flotilla-bench modes`' two scenarios on this tree and on an earlier commit, side by side: both engine modes,
# the commits and modes interleaved run by run, median of RUNS. Usage: scripts/engine_modes_ab.sh REF [RUNS]
#
# Why a script: only ratios measured in one session survive this shared machine's drift, so the "before"
# servers must run beside the "after" ones. REF is checked out in a temporary worktree and its servers run
# with PYTHONPATH at its server/ (this tree's venv, benchmark client and kernels; REF's server code).
set -euo pipefail

readonly REF=${1:?usage: scripts/engine_modes_ab.sh REF [RUNS]} RUNS=${2:-3}
readonly ROOT=$(git rev-parse --show-toplevel)
readonly BEFORE=$(mktemp -d) DRIVER=$(mktemp --suffix=.py)
trap 'git -C "$ROOT" worktree remove --force "$BEFORE"; rm -f "$DRIVER"' EXIT
git -C "$ROOT" worktree add -q --detach "$BEFORE" "$REF"
cp -r "$ROOT/server/flotilla_server/model/kernels/build" "$BEFORE/server/flotilla_server/model/kernels/" 2>/dev/null || true

# A file, not stdin, with a main guard: the /healthz poller is a spawned process, which imports the main module.
cat >"$DRIVER" <<'PY'
import os, sys
from flotilla_server.bench import engine_modes as em
from flotilla_server.bench.tiny_server import tiny_server


def main(before: str, runs: int) -> None:
    arms = {f"{mode}, {when}": (path, mode) for when, path in (("before", before), ("now", "")) for mode in em.MODES}
    results = {arm: {"stream": [], "burst": []} for arm in arms}
    for i in range(runs):
        for arm in (list(arms) if i % 2 == 0 else list(reversed(arms))):
            path, mode = arms[arm]
            os.environ["PYTHONPATH"] = path  # the servers' code; this process has imported its own already
            with tiny_server("--engine-mode", mode, "--max-num-seqs", "64", "--max-model-len", "512") as s:
                results[arm]["stream"].append(em.measure_stream(s.port, s.pid, 64, 64))
            with tiny_server("--engine-mode", mode, "--max-num-seqs", "4", "--queue-depth-per-slot", "8",
                             "--queue-timeout-s", "5", "--max-model-len", "512") as s:
                results[arm]["burst"].append(em.measure_burst(s.port, s.pid, 200, 64, 3))
            print(f"run {i + 1}/{runs} {arm}: {results[arm]['stream'][-1]} {results[arm]['burst'][-1]}", flush=True)
    print("| median of", runs, "| stream tokens/s | stream /healthz p99 ms | burst 429 p95 ms | burst /healthz p99 / max ms |")
    for arm, m in em.medians(results).items():
        st, bu = m["stream"], m["burst"]
        print(f"| {arm} | {st['tokens_per_s']:,.0f} | {st['healthz_p99_ms']:.1f} | {bu['p95_429_ms']:.1f} | "
              f"{bu['healthz_p99_ms']:.1f} / {bu['healthz_max_ms']:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
PY
"$ROOT/.venv/bin/python" "$DRIVER" "$BEFORE/server" "$RUNS"
