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
mkdir -p "$FB/services/ivy" "$FB/services/tulip" "$FB/services/rose" "$FB/bench/loadgen"
ln -s "$B/bin/ivy" "$FB/services/ivy/ivy"; ln -s "$B/bin/tulip" "$FB/services/tulip/tulip"
ln -s "$B/bin/rose" "$FB/services/rose/rose"; ln -s "$B/bin/loadgen" "$FB/bench/loadgen/loadgen"
BUILD_DIR="$FB" "$ROOT/scripts/mesh.sh" --model "$T/m" --device cuda --port 18080 --tulip-port 15051 \
  --metrics-port 19091 --tulip-arg --queue-limit-tokens=4194304 "${EXTRA[@]}" > "$OUT/mesh.log" 2>&1 &
MESH=$!
ready=0
for i in $(seq 360); do
  curl -sf http://127.0.0.1:18080/ready > /dev/null 2>&1 && { ready=1; break; }
  kill -0 $MESH 2>/dev/null || break
  sleep 0.5
done
[ $ready = 1 ] || { echo "mesh not ready"; tail -20 "$OUT/mesh.log"; kill -TERM $MESH; exit 1; }
BUILD_DIR="$FB" timeout 300 "$ROOT/bench/suites/concurrency.sh" --ivy 127.0.0.1:18080 --out "$OUT/suite4" \
  --duration "$DURATION" --warmup 20 2>&1 | tail -12
rc=$?
curl -s http://127.0.0.1:19091/metrics > "$OUT/tulip_metrics.txt" 2>/dev/null
curl -s http://127.0.0.1:18080/metrics > "$OUT/ivy_metrics.txt" 2>/dev/null
kill -TERM $MESH; wait $MESH 2>/dev/null
python3 "$ROOT/bench/render/render.py" "$OUT/suite4" --out "$OUT/report" > "$OUT/render.log" 2>&1
cat "$OUT/report/report.md" 2>/dev/null | head -30
exit $rc
