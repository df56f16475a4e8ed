#!/usr/bin/env bash
# The chat mesh on the GPU host: tulip (spawning rose --device cuda) and ivy from a gpu_pack.sh
# folder on a gpt-oss checkpoint, then gpu_mesh_smoke.py's requests through ivy's HTTP API.
#   bench/suites/gpu_mesh_smoke.sh GPUBIN MODEL_DIR TOKENIZER_JSON LOG_DIR
set -uo pipefail
BIN=$1 MODEL=$2 TOK=$3 LOGS=$4
HERE="$(cd "$(dirname "$0")" && pwd)"
[ -f "$MODEL/tokenizer.json" ] || cp "$TOK" "$MODEL/tokenizer.json"
"$BIN/tulip" --host 127.0.0.1 --port 50151 --metrics-port 9191 --model "$MODEL" --device cuda \
  --rose-bin "$BIN/rose" --shm-name /garden-gpu-mesh --served-model-name gpt-oss-gpu \
  > "$LOGS/mesh_tulip.log" 2>&1 &
tulip_pid=$!
"$BIN/ivy" --host 127.0.0.1 --port 8181 --tulip 127.0.0.1:50151 --tokenizer "$MODEL/tokenizer.json" \
  --served-model-name gpt-oss-gpu > "$LOGS/mesh_ivy.log" 2>&1 &
ivy_pid=$!
python3 "$HERE/gpu_mesh_smoke.py" http://127.0.0.1:8181 gpt-oss-gpu
rc=$?
curl -s http://127.0.0.1:9191/metrics > "$LOGS/mesh_tulip_metrics.txt" 2>/dev/null
kill -TERM "$ivy_pid" "$tulip_pid" 2>/dev/null
wait "$ivy_pid" "$tulip_pid" 2>/dev/null
grep -E '"level":"(error|warn)"' "$LOGS/mesh_tulip.log" "$LOGS/mesh_ivy.log" | head -20
exit $rc
