#!/usr/bin/env bash
# The chat benchmark in one command: starts a chat mesh (scripts/mesh.sh) on a gpt-oss model
# directory, runs the chat suite against it (chat.sh: TTFT, ITL, TPOT and output tokens/s at
# 1..64 concurrent streams), saves tulip's and ivy's metrics, stops the mesh and renders the report
# (bench/render/render.py: DIR/report.md + SVGs).
#   bench/suites/chat_host.sh --model DIR --out DIR [--device cpu|cuda] [--rose-threads N]
#                             [chat.sh flags: --streams "1 2 4" --max-tokens N --lengths "A B"
#                              --quick --count N --duration S --warmup N]
# BUILD_DIR (default build/) must hold ivy, tulip, rose and bench/loadgen/loadgen. On CPU with the
# tiny random gpt-oss (scripts/demo.sh writes models/gpt-oss-tiny) this only validates the
# harness; GPU figures need real weights on a GPU. Exit status: 0 when every step ran.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="" OUT="" DEVICE=cuda
mesh_extra=() pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --rose-threads) mesh_extra+=(--rose-threads "$2"); shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -n "$MODEL" ] && [ -n "$OUT" ] || { echo "chat_host.sh: --model DIR and --out DIR are required" >&2; exit 2; }
mkdir -p "$OUT/logs"
# Ports: BENCH_IVY_PORT, BENCH_TULIP_PORT, BENCH_METRICS_PORT (not IVY_*/TULIP_*: the binaries
# read those as flags).
IVY_PORT="${BENCH_IVY_PORT:-18081}" TULIP_PORT="${BENCH_TULIP_PORT:-15052}"
METRICS_PORT="${BENCH_METRICS_PORT:-19092}"
"$ROOT/scripts/mesh.sh" --model "$MODEL" --device "$DEVICE" --port "$IVY_PORT" \
  --tulip-port "$TULIP_PORT" --metrics-port "$METRICS_PORT" "${mesh_extra[@]}" \
  > "$OUT/logs/mesh.log" 2>&1 &
MESH=$!
trap 'kill -TERM $MESH 2>/dev/null || true; wait $MESH 2>/dev/null || true' EXIT
python3 - "$IVY_PORT" <<'PY' || { echo "chat_host.sh: mesh not ready; see $OUT/logs/mesh.log" >&2; tail -30 "$OUT/logs/mesh.log" >&2; exit 1; }
import sys, time, urllib.request
port = sys.argv[1]
for _ in range(1200):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
status=0
"$HERE/chat.sh" --ivy "127.0.0.1:$IVY_PORT" --out "$OUT" "${pass[@]}" 2>&1 \
  | tee "$OUT/logs/chat.log" || status=1
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" > "$OUT/logs/tulip_metrics.txt" 2>/dev/null || true
curl -s "http://127.0.0.1:$IVY_PORT/metrics" > "$OUT/logs/ivy_metrics.txt" 2>/dev/null || true
kill -TERM $MESH 2>/dev/null || true
wait $MESH 2>/dev/null || true
trap - EXIT
python3 "$ROOT/bench/render/render.py" --out "$OUT" "$OUT" || status=1
exit $status
