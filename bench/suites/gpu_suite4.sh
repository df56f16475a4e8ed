#!/usr/bin/env bash
# Suite 4 (high concurrency through ivy) on the GPU host, from a release bundle: ivy tokenizes text
# with our byte-level BPE and the real Qwen3 tokenizer.json, tulip batches, rose runs the random
# Qwen3-Embedding-0.6B-shaped checkpoint on CUDA (graphs on). 512 tokens, batch 1, 1..16 clients.
#   bench/suites/gpu_suite4.sh BUNDLE QWEN3_TOKENIZER_JSON OUT [--duration S]
# Env: SUITE4_TULIP_ARGS (extra tulip flags, space-separated, e.g. "--max-inflight-batches=1"),
#      SUITE4_MODEL (reuse a checkpoint made by make_random_qwen3.py instead of making one).
set -uo pipefail
B="$(cd "$1" && pwd)"; TOK="$2"; OUT="$3"; shift 3
DURATION=8
[ "${1:-}" = --duration ] && DURATION="$2"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export LD_LIBRARY_PATH="$B/lib:${LD_LIBRARY_PATH:-}"  # loadgen was copied in without an rpath
mkdir -p "$OUT"
T="$(mktemp -d)"
if [ -n "${SUITE4_MODEL:-}" ]; then
  cp -r "$SUITE4_MODEL" "$T/m"
else
  timeout 120 python3 "$ROOT/bench/suites/make_random_qwen3.py" --out "$T/m" > "$OUT/make_model.log" 2>&1 ||
    { echo "model failed"; tail "$OUT/make_model.log"; exit 1; }
fi
cp "$TOK" "$T/m/tokenizer.json"
EXTRA=()
for a in ${SUITE4_TULIP_ARGS:-}; do EXTRA+=(--tulip-arg "$a"); done
FB="$T/build"
source "$ROOT/bench/suites/gpu_mesh.sh"
bundle_build_dir "$B" "$FB"
start_bundle_mesh "$FB" "$OUT/mesh.log" "$T/m" cuda --tulip-arg --queue-limit-tokens=4194304 \
  "${EXTRA[@]}" || exit 1
BUILD_DIR="$FB" timeout 300 "$ROOT/bench/suites/concurrency.sh" --ivy 127.0.0.1:18080 --out "$OUT/suite4" \
  --duration "$DURATION" --warmup 20 2>&1 | tail -12
rc=$?
curl -s http://127.0.0.1:19091/metrics > "$OUT/tulip_metrics.txt" 2>/dev/null
curl -s http://127.0.0.1:18080/metrics > "$OUT/ivy_metrics.txt" 2>/dev/null
kill -TERM $MESH; wait $MESH 2>/dev/null
python3 "$ROOT/bench/render/render.py" "$OUT/suite4" --out "$OUT/report" > "$OUT/render.log" 2>&1
cat "$OUT/report/report.md" 2>/dev/null | head -30
exit $rc
