#!/usr/bin/env bash
# Suite 1 on the GPU host with loadgen's two gRPC client APIs, alternating on one CUDA mesh (graphs
# on, --precapture 1x128,1x512,1x4096), then the Hugging Face peer's suite 1 alone on the GPU.
#   bench/suites/gpu_client_api.sh BUNDLE OUT [ROUNDS]
# BUNDLE: a CUDA release bundle with bench/loadgen/loadgen in its bin/. Writes OUT/{sync,callback}N/
# and OUT/peer/ (result JSON) and prints one table: p50 / p99 per length and API, and HF.
# CPU dry run of the plumbing: SESSION_MODEL=DIR SESSION_DEVICE=cpu SESSION_MAX_LEN=N (no peer).
set -uo pipefail
B="$(cd "$1" && pwd)"; OUT="$2"; ROUNDS="${3:-2}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export LD_LIBRARY_PATH="$B/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
T="$(mktemp -d)"
DEVICE=${SESSION_DEVICE:-cuda}
if [ -n "${SESSION_MODEL:-}" ]; then
  cp -r "$SESSION_MODEL" "$T/m"
else
  timeout 120 python3 "$ROOT/bench/suites/make_random_qwen3.py" --out "$T/m" > "$OUT/make_model.log" 2>&1 ||
    { echo "model failed"; tail "$OUT/make_model.log"; exit 1; }
fi
FB="$T/build"
source "$ROOT/bench/suites/gpu_mesh.sh"
bundle_build_dir "$B" "$FB"
[ "$DEVICE" = cuda ] && export ROSE_CUDA_GRAPHS=on ROSE_PRECAPTURE=1x128,1x512,1x4096
start_bundle_mesh "$FB" "$OUT/mesh.log" "$T/m" "$DEVICE" || exit 1
rc=0
for r in $(seq "$ROUNDS"); do
  for api in sync callback; do
    BUILD_DIR="$FB" timeout 120 "$ROOT/bench/suites/low_latency_embed.sh" --tulip 127.0.0.1:15051 \
      --out "$OUT/$api$r" --count 200 --warmup 20 --max-len "${SESSION_MAX_LEN:-0}" -- --grpc-api "$api" > "$OUT/$api$r.log" 2>&1 ||
      { echo "suite 1 ($api, round $r) failed"; tail -5 "$OUT/$api$r.log"; rc=1; }
  done
done
kill -TERM $MESH; wait $MESH 2>/dev/null
unset ROSE_CUDA_GRAPHS ROSE_PRECAPTURE
if [ "$DEVICE" = cuda ]; then
  PYTHONUNBUFFERED=1 timeout 150 python3 "$ROOT/bench/peer/hf_embed_baseline.py" --out "$OUT/peer" \
    --suites 1 --count 20 --warmup 3 > "$OUT/peer.log" 2>&1 || { echo "HF peer failed"; tail -5 "$OUT/peer.log"; rc=1; }
fi
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*", "*.json"))):
    try:
        j = json.load(open(f))
    except Exception:
        continue
    if j.get("schema") != "garden.bench.result.v1":
        continue
    run = os.path.basename(os.path.dirname(f))
    l = j["latency_ms"]
    rows.setdefault(j["workload"], []).append(f"{run} {l['p50']:.3f}/{l['p99']:.3f}")
for w in sorted(rows, key=lambda n: int(n.split("tok")[1].split("_")[0])):
    print(w, " | ".join(rows[w]))
print("cells: run p50/p99 ms (sync/callback = loadgen --grpc-api; peer = HF transformers)")
PY
exit $rc
