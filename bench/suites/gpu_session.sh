#!/usr/bin/env bash
# Everything GPU-side in one device call, from a release bundle (scripts/bundle.sh with CUDA, plus
# bench/loadgen/loadgen copied into its bin/):
#   1. tests/deploy/gpu_host_demo.sh: the bundle's mesh on CUDA and CPU with the tiny default model
#   2. a random Qwen3-Embedding-0.6B-shaped checkpoint (make_random_qwen3.py)
#   3. the embedding suites through the bundle's mesh on CUDA (gpu_host.sh --no-peer)
#   4. the Hugging Face peer on the same GPU, alone, same workloads
#   5. the report with both and their ratios (render.py)
#     bench/suites/gpu_session.sh BUNDLE OUT [--count N] [--warmup N]
set -uo pipefail
B="$(cd "$1" && pwd)"; OUT="$2"; shift 2
COUNT=50 WARMUP=5 PEER_COUNT=20
while [ $# -gt 0 ]; do
  case "$1" in
    --count) COUNT="$2"; shift 2 ;;
    --peer-count) PEER_COUNT="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    *) echo "gpu_session.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$OUT"
T="$(mktemp -d)"
echo "== 1. bundle demo"; timeout 150 bash "$ROOT/tests/deploy/gpu_host_demo.sh" "$B" "$OUT/bundle-demo.txt" > /dev/null 2>&1
echo "demo exit $?"; tail -25 "$OUT/bundle-demo.txt"
echo "== 2. random 0.6B checkpoint"
timeout 120 python3 "$ROOT/bench/suites/make_random_qwen3.py" --out "$T/qwen3-0.6b-random" 2>&1 | tail -2
"$B/bin/rose-mkmodel" --out "$T/tiny" --repo "$ROOT" > /dev/null 2>&1 &&
  cp "$T/tiny/tokenizer.model" "$T/qwen3-0.6b-random/"  # ivy's tokenizer for suite 4 (ids < vocab)
# scripts/mesh.sh runs binaries from $BUILD_DIR's layout: point it at the bundle.
FB="$T/build"
mkdir -p "$FB/services/ivy" "$FB/services/tulip" "$FB/services/rose" "$FB/bench/loadgen"
ln -s "$B/bin/ivy" "$FB/services/ivy/ivy"; ln -s "$B/bin/tulip" "$FB/services/tulip/tulip"
ln -s "$B/bin/rose" "$FB/services/rose/rose"; ln -s "$B/bin/loadgen" "$FB/bench/loadgen/loadgen"
echo "== 3. suites on the bundle's CUDA mesh"
BUILD_DIR="$FB" timeout 300 "$ROOT/bench/suites/gpu_host.sh" --model "$T/qwen3-0.6b-random" \
  --out "$OUT/run" --no-peer --count "$COUNT" --warmup "$WARMUP" 2>&1 | tail -15
echo "== 4. Hugging Face peer"
PYTHONUNBUFFERED=1 timeout 240 python3 "$ROOT/bench/peer/hf_embed_baseline.py" \
  --out "$OUT/run/peer" --count "$PEER_COUNT" --warmup 3 2>&1 | tail -15
echo "== 5. report"
python3 "$ROOT/bench/render/render.py" "$OUT/run/garden" "$OUT/run/peer" --out "$OUT/run/report" 2>&1 | tail -3
ls "$OUT/run" "$OUT/run/report"
