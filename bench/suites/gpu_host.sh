#!/usr/bin/env bash
# The whole GPU benchmark in one command on the GPU host: starts a mesh (scripts/mesh.sh, rose on
# cuda) on the given model, runs every embedding suite against it (run_all.sh), then the Hugging
# Face peer baseline on the same GPU, and renders one report with both and their ratios.
#   bench/suites/gpu_host.sh --model DIR --out DIR [--device cuda] [--no-peer] [--quick]
#                            [--max-len N] [--lengths "A B"] [common suite flags]
# BUILD_DIR (default build/) must hold ivy, tulip, rose and bench/loadgen/loadgen. The mesh is
# stopped on exit. Exit status: 0 when every step ran.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODEL="" OUT="" DEVICE=cuda PEER=1
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --no-peer) PEER=0; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -n "$MODEL" ] && [ -n "$OUT" ] || { echo "gpu_host.sh: --model DIR and --out DIR are required" >&2; exit 2; }
mkdir -p "$OUT/garden" "$OUT/peer" "$OUT/logs"
IVY_PORT=18080 TULIP_PORT=15051 METRICS_PORT=19091
"$ROOT/scripts/mesh.sh" --model "$MODEL" --device "$DEVICE" --port $IVY_PORT \
  --tulip-port $TULIP_PORT --metrics-port $METRICS_PORT > "$OUT/logs/mesh.log" 2>&1 &
MESH=$!
trap 'kill -TERM $MESH 2>/dev/null || true; wait $MESH 2>/dev/null || true' EXIT
python3 - "$IVY_PORT" <<'PY' || { echo "gpu_host.sh: mesh not ready; see $OUT/logs/mesh.log" >&2; tail -30 "$OUT/logs/mesh.log" >&2; exit 1; }
import sys, time, urllib.request
port = sys.argv[1]
for _ in range(600):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
status=0
"$HERE/run_all.sh" --tulip 127.0.0.1:$TULIP_PORT --ivy 127.0.0.1:$IVY_PORT --out "$OUT/garden" \
  "${pass[@]}" 2>&1 | tee "$OUT/logs/suites.log" || status=1
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" > "$OUT/logs/tulip_metrics.txt" 2>/dev/null || true
# The peer runs alone on the GPU: stop the mesh first so both never share it.
kill -TERM $MESH 2>/dev/null || true
wait $MESH 2>/dev/null || true
trap - EXIT
if [ "$PEER" = 1 ]; then
  peer=(python3 "$ROOT/bench/peer/hf_embed_baseline.py" --out "$OUT/peer")
  prev=""
  for a in "${pass[@]}"; do
    [ "$a" = --quick ] && peer+=(--quick)
    [ "$prev" = --max-len ] && peer+=(--max-len "$a")
    prev="$a"
  done
  PYTHONUNBUFFERED=1 "${peer[@]}" 2>&1 | tee "$OUT/logs/peer.log" || status=1
fi
python3 "$ROOT/bench/render/render.py" --out "$OUT" "$OUT/garden" "$OUT/peer" || status=1
exit $status
