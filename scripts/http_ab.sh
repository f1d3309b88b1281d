#!/usr/bin/env bash
# One client and 16 clients over HTTP on SmolLM2, two server set-ups interleaved round by round: by default
# small steps on every core (the default) against `--small-step-threads 0` (every step on the engine's own
# threads). OFF_ARGS / ON_ARGS (server flags) and OFF_ENV / ON_ENV (VAR=value words) choose other pairs, e.g.
#   OFF_ARGS= OFF_ENV=FLOTILLA_NATIVE_KERNELS=off scripts/http_ab.sh 2 bench-results/native-http
# compares the native one-row kernel with oneDNN's and MKL's paths.
#
# Why a script: the step profile (scripts/single_stream_ab.sh) times the engine alone; this is what a user
# streaming from the server sees, HTTP process included, and the ratio of rounds made side by side is the
# only figure this shared machine's drift leaves standing. Needs `make model`. Prints each round's output
# tokens/s and the median ratio; the JSON of every run stays in the output folder.
set -euo pipefail

readonly ROUNDS=${1:-3} OUT=${2:-bench-results/small-step-threads}
readonly OFF_ARGS=${OFF_ARGS---small-step-threads 0} ON_ARGS=${ON_ARGS-} OFF_ENV=${OFF_ENV-} ON_ENV=${ON_ENV-}
readonly ROOT=$(git rev-parse --show-toplevel)
readonly BIN=$ROOT/.venv/bin MODEL=${FLOTILLA_CACHE_DIR:-$HOME/.cache/flotilla}/models/SmolLM2-135M-Instruct.Q4_1.gguf
readonly PORT=${PORT:-8461}
[ -f "$MODEL" ] || { echo "$MODEL is missing: run make model" >&2; exit 2; }
mkdir -p "$OUT"

serve_and_load() {  # NAME ENV_WORDS SERVER_ARGS
  local name=$1 environment=$2 args=$3
  # shellcheck disable=SC2086  # the env words and the flags are word lists
  env $environment "$BIN/flotilla-server" --model "$MODEL" --kv-cache-memory 1Gi --max-model-len 2048 --port "$PORT" \
    --log-level warning $args & local pid=$!
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.5; done
  for c in 1 16; do
    "$BIN/flotilla-bench" online --base-url "http://127.0.0.1:$PORT" --concurrency "$c" --num-requests $((c * 4)) \
      --output-len-min 64 --output-len-max 64 --no-progress --json "$OUT/$name-c$c.json" >/dev/null
  done
  kill -INT "$pid"; wait "$pid" || true
}

for i in $(seq 1 "$ROUNDS"); do
  serve_and_load "off-$i" "$OFF_ENV" "$OFF_ARGS"
  serve_and_load "on-$i" "$ON_ENV" "$ON_ARGS"
done

"$BIN/python" - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for c in (1, 16):
    tps = {m: [json.load(open(f"{out}/{m}-{i}-c{c}.json"))["summary"]["output_token_throughput_per_s"]
               for i in range(1, rounds + 1)] for m in ("off", "on")}
    ratios = [a / b for a, b in zip(tps["on"], tps["off"])]
    print(f"{c} client(s): output tok/s off {[round(v, 1) for v in tps['off']]} on {[round(v, 1) for v in tps['on']]} "
          f"ratio per round {[round(r, 2) for r in ratios]} median {statistics.median(ratios):.2f}")
PY
