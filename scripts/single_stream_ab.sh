#!/usr/bin/env bash
# Batch-1 and batch-16 decode on llama-100m, this checkout against an earlier commit, interleaved run by run.
#
# Why a script: on a shared machine absolute times drift by 2x within minutes, so a speed-up is only shown by
# ratios of runs made side by side. The earlier commit is exported (git archive, no worktree) to a temporary
# directory; it may predate `flotilla-bench steps`, so this checkout's profile module is copied into it (the
# profile reads the engine's step records only, and reports 0 for parts an older engine does not time).
# Prints each round's decode tokens/s and the median ratio; the JSON of every run stays in the output folder.
# DTYPE=bfloat16 (default float32) runs both commits in that dtype.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: [DTYPE=bfloat16] $0 BASE_COMMIT [ROUNDS] [OUT_DIR]   (for example: $0 08bd594 3 bench-results/single-stream)" >&2
  exit 2
fi
readonly BASE=$1 ROUNDS=${2:-3} DTYPE=${DTYPE:-float32}
OUT=$(realpath -m "${3:-bench-results/single-stream}")  # absolute: each profile runs inside its own tree
readonly OUT
readonly ROOT=$(git rev-parse --show-toplevel)
readonly PY=${PYTHON:-$ROOT/.venv/bin/python}
BASE_TREE=$(mktemp -d)
trap 'rm -rf "$BASE_TREE"' EXIT
git -C "$ROOT" archive "$BASE" | tar -x -C "$BASE_TREE"
cp "$ROOT/server/flotilla_server/bench/step_profile.py" "$BASE_TREE/server/flotilla_server/bench/"
mkdir -p "$OUT"

profile() {  # TREE JSON
  local t=$1
  (cd "$t" && PYTHONPATH="$t/contract:$t/server" OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=10000 "$PY" -c '
import argparse, sys
from flotilla_server.bench import step_profile as s
p = argparse.ArgumentParser(); s.add_arguments(p); sys.exit(s.run(p.parse_args(sys.argv[1:])))' \
    --model llama-100m --batch 1 --batch 16 --steps 24 --dtype "$DTYPE" --json "$2" >/dev/null 2>&1)
}

for i in $(seq 1 "$ROUNDS"); do
  profile "$BASE_TREE" "$OUT/base-$i.json"
  profile "$ROOT" "$OUT/new-$i.json"
done

"$PY" - "$OUT" "$ROUNDS" "$DTYPE" <<'EOF'
import json, statistics, sys
out, rounds, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = {t: [json.load(open(f"{out}/{t}-{i}.json"))["models"]["llama-100m"]["batches"] for i in range(1, rounds + 1)]
        for t in ("base", "new")}
for batch in runs["new"][0]:
    for key in ("decode_tokens_per_s", "decode_tokens_per_cpu_s"):
        base = [r[batch][key] for r in runs["base"]]
        new = [r[batch][key] for r in runs["new"]]
        ratios = [n / b for n, b in zip(new, base)]
        print(f"llama-100m {dtype} batch {batch} {key}: base {[round(v, 1) for v in base]} new {[round(v, 1) for v in new]} "
              f"ratio per round {[round(v, 2) for v in ratios]} median {statistics.median(ratios):.2f}")
EOF
