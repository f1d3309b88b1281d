#!/usr/bin/env bash
# The checks that need a GPU, in one run on a lent machine (docs/benchmarks.md, "On a GPU"):
#   1. the KV pool sized from memory: a ~1B random Llama served with the default flags (--gpu-memory-utilization
#      0.9) must leave free memory within ±5 % of 0.1 × total after start-up (nvidia-smi, and
#      torch.cuda.mem_get_info from another process), with and without CUDA graphs;
#   2. the default (decode steps replayed from captured CUDA graphs) against eager steps (--cuda-graphs off)
#      over HTTP, 1 and 16 clients;
#   3. the engine's equality with transformers and the graph tests on the GPU (FLOTILLA_TEST_DEVICE=cuda);
#   4. --quantization fp8 (e4m3 projections, torch._scaled_mm) against bfloat16: weight memory and KV blocks
#      after start-up, tokens/s at 1 and 16 clients, and top-1 agreement teacher-forced over 1,024 tokens of
#      tests/server/model/texts/public_domain.txt.
# Usage: scripts/gpu_checks.sh [OUT_DIR]. Needs python3 with torch (CUDA), transformers, httpx and the
# server's own dependencies (on a machine without an index, install wheels first). Writes a log per step and
# summary.json into OUT_DIR.
set -uo pipefail

readonly OUT=${1:-gpu-checks} ROOT=$(cd "$(dirname "$0")/.." && pwd) PORT=${PORT:-8471}
readonly MODEL_DIR=${MODEL_DIR:-/tmp/flotilla-llama-1b} DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of the script
# ~1B parameters: TinyLlama's shapes (hidden 2048, 22 layers, 4 KV heads) with the test tokenizer's vocabulary
readonly MODEL_SHAPE=${MODEL_SHAPE:-'{"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
  "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 4096}'}
mkdir -p "$OUT"
export PYTHONPATH="$ROOT/contract:$ROOT/server:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"

[ -f "$MODEL_DIR/config.json" ] || python3 - "$MODEL_DIR" "$MODEL_SHAPE" <<'PY'
import json, sys
from tests.support.hf_models import make_hf_model_dir
make_hf_model_dir("llama", sys.argv[1], **json.loads(sys.argv[2]))
PY

serve() {  # NAME [FLAGS...]: start, wait for /readyz, measure memory, load it, stop
  local name=$1; shift
  python3 -m flotilla_server.cli --model "$MODEL_DIR" --device "$DEVICE" --dtype bfloat16 --max-model-len 4096 \
    --port "$PORT" --log-level info "$@" >"$OUT/server-$name.log" 2>&1 & local pid=$!
  python3 - "$PORT" "$pid" <<'PY'
import pathlib, sys, time, urllib.request
stat = pathlib.Path(f"/proc/{sys.argv[2]}/stat")
for _ in range(480):
    if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
        break  # it refused to start: its log says why
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=1)
        break
    except OSError:
        time.sleep(0.5)
PY
  nvidia-smi --query-gpu=memory.free,memory.total --format=csv,noheader,nounits >"$OUT/smi-$name.txt"
  python3 -c "import torch, json; f, t = torch.cuda.mem_get_info(); print(json.dumps({'free': f, 'total': t}))" \
    >"$OUT/torch-mem-$name.json"
  for c in 1 16; do
    timeout 120 python3 -m flotilla_server.bench.cli online --base-url "http://127.0.0.1:$PORT" --concurrency "$c" \
      --num-requests $((c * 4)) --output-len-min 128 --output-len-max 128 --no-progress \
      --json "$OUT/online-$name-c$c.json" >/dev/null 2>>"$OUT/server-$name.log"
  done
  kill -INT "$pid"; sleep 1; kill -INT "$pid" 2>/dev/null; wait "$pid"
}
serve eager --cuda-graphs off
serve default
serve fp8 --quantization fp8

(cd "$ROOT" && timeout 240 python3 - "$MODEL_DIR" "$DEVICE" <<'PY') >"$OUT/fp8-agreement.json" 2>"$OUT/fp8-agreement.log"
import json, sys
import torch
from flotilla_server.model import load_model
from tests.server.model.test_quantized_accuracy import TEXT, teacher_forced_chunks
model_dir, device = sys.argv[1], sys.argv[2]
bf16 = load_model(model_dir, "bfloat16", device, "none")
fp8 = load_model(model_dir, "bfloat16", device, "fp8")
ids = bf16.tokenizer.encode(TEXT.read_text())[:1024]
agree = kl = 0.0
for a, b in zip(teacher_forced_chunks(fp8.model, ids, device), teacher_forced_chunks(bf16.model, ids, device), strict=True):
    agree += (a.argmax(-1) == b.argmax(-1)).sum().item()
    kl += torch.nn.functional.kl_div(a.float(), b.float(), log_target=True, reduction="sum").item()
print(json.dumps({"tokens": len(ids), "top1_agreement": agree / len(ids), "mean_kl_nats": kl / len(ids),
                  "weight_mib": {"bfloat16": bf16.model.weight_bytes() / 2**20, "fp8": fp8.model.weight_bytes() / 2**20}}))
PY

(cd "$ROOT" && FLOTILLA_TEST_DEVICE=$DEVICE timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/server/engine/test_engine_equality.py tests/server/engine/test_decode_graphs.py) >"$OUT/pytest-cuda.log" 2>&1
echo "pytest exit $?" >>"$OUT/pytest-cuda.log"

python3 - "$OUT" <<'PY' | tee "$OUT/summary.json"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
summary = {}
for name in ("eager", "default", "fp8"):
    row = summary[name] = {}
    try:
        free_mib, total_mib = (int(x) for x in (out / f"smi-{name}.txt").read_text().split(","))
        row["free_share_smi"] = free_mib / total_mib
        row["within_5pct_of_0.1"] = abs(free_mib / total_mib - 0.1) <= 0.005
        torch_mem = json.loads((out / f"torch-mem-{name}.json").read_text())
        row["free_share_torch"] = torch_mem["free"] / torch_mem["total"]
    except (OSError, ValueError) as e:
        row["memory_error"] = repr(e)
    log = (out / f"server-{name}.log").read_text().splitlines()
    pool = [line for line in log if "KV pool:" in line]
    row["pool"] = pool[-1] if pool else None
    weights = [line for line in log if "weights held as" in line]
    row["weights"] = weights[-1] if weights else None
    row["output_tokens_per_s"] = {c: json.loads(p.read_text())["summary"]["output_token_throughput_per_s"]
                                  for c in (1, 16) if (p := out / f"online-{name}-c{c}.json").exists()}
try:
    summary["fp8_against_bfloat16"] = json.loads((out / "fp8-agreement.json").read_text())
except (OSError, ValueError) as e:
    summary["fp8_against_bfloat16"] = {"error": repr(e)}
print(json.dumps(summary, indent=1))
PY
tail -3 "$OUT/pytest-cuda.log"
