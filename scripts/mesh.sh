#!/usr/bin/env bash
# Starts rose (spawned by tulip), tulip and ivy locally in the foreground from the build tree, and
# stops all three cleanly on Ctrl-C / SIGTERM. A tier that crashes is started again (with a
# backoff; scripts/supervise.sh) while the others keep running: tulip restarts rose itself.
#   scripts/mesh.sh --model DIR [--port 8080] [--host 127.0.0.1] [--device cpu|cuda]
#                   [--pooling last|mean|cls] [--tulip-port 50051] [--metrics-port 9091]
#                   [--name NAME] [--rose-threads N] [--tulip-arg ARG]... [--ivy-arg ARG]...
# DIR is a Hugging Face model directory: an embedding model (Qwen3) or a chat model (gpt-oss:
# config.json model_type "gpt_oss"; ivy then serves /v1/chat/completions and /v1/completions).
# ivy tokenizes with DIR/tokenizer.model, else DIR/tokenizer.json. One model per mesh: run a
# second mesh on other ports for a second model (scripts/demo.sh runs two). Everything binds
# 127.0.0.1; --host 0.0.0.0 serves ivy's HTTP API to other machines (tulip stays on 127.0.0.1).
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/supervise.sh"

MODEL="" PORT=8080 HOST=127.0.0.1 DEVICE=cpu POOLING="" TULIP_PORT=50051 METRICS_PORT=9091 NAME="" ROSE_THREADS=""
TULIP_EXTRA=() IVY_EXTRA=()
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --host) HOST="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --pooling) POOLING="$2"; shift 2 ;;
    --tulip-port) TULIP_PORT="$2"; shift 2 ;;
    --metrics-port) METRICS_PORT="$2"; shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    --rose-threads) ROSE_THREADS="$2"; shift 2 ;;
    --tulip-arg) TULIP_EXTRA+=("$2"); shift 2 ;;
    --ivy-arg) IVY_EXTRA+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "mesh.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$MODEL" ] || { echo "mesh.sh: --model DIR is required" >&2; usage >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "mesh.sh: $MODEL/config.json not found" >&2; exit 2; }
case "$DEVICE" in cpu|cuda) ;; *) echo "mesh.sh: --device must be cpu or cuda" >&2; exit 2 ;; esac
MODEL="$(cd "$MODEL" && pwd)"

IVY="$BUILD_DIR/services/ivy/ivy"
TULIP="$BUILD_DIR/services/tulip/tulip"
ROSE="$BUILD_DIR/services/rose/rose"
for b in "$IVY" "$TULIP" "$ROSE"; do
  [ -x "$b" ] || { echo "mesh.sh: $b is missing; build first (scripts/demo.sh does)" >&2; exit 2; }
done

TOKENIZER_ARGS=()
[ -f "$MODEL/tokenizer.model" ] && TOKENIZER_ARGS=(--tokenizer "$MODEL/tokenizer.model")
[ ! -f "$MODEL/tokenizer.model" ] && [ -f "$MODEL/tokenizer.json" ] && TOKENIZER_ARGS=(--tokenizer "$MODEL/tokenizer.json")
NAME_ARGS=()
[ -n "$NAME" ] && NAME_ARGS=(--served-model-name "$NAME")
ROSE_ARGS=()
[ -n "$POOLING" ] && ROSE_ARGS+=(--pooling "$POOLING")
[ -n "$ROSE_THREADS" ] && ROSE_ARGS+=(--rose-threads "$ROSE_THREADS")
KIND=embedding
grep -Eq '"model_type"[[:space:]]*:[[:space:]]*"gpt_oss"' "$MODEL/config.json" && KIND=chat

pids=()
stop() {
  trap - INT TERM HUP EXIT
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap 'stop; exit 0' INT TERM HUP
trap stop EXIT
# Job control: each tier gets its own process group, so a terminal's Ctrl-C reaches this script
# only, and the tiers stop in order through stop() (SIGTERM) rather than all at once.
set -m

supervise tulip "" "$TULIP" --host 127.0.0.1 --port "$TULIP_PORT" --metrics-port "$METRICS_PORT" \
  --model "$MODEL" --device "$DEVICE" --rose-bin "$ROSE" --shm-name "/garden-mesh-$TULIP_PORT" \
  "${ROSE_ARGS[@]}" "${NAME_ARGS[@]}" "${TULIP_EXTRA[@]}" &
pids+=($!)
supervise ivy "" "$IVY" --host "$HOST" --port "$PORT" --tulip "127.0.0.1:$TULIP_PORT" \
  "${TOKENIZER_ARGS[@]}" "${NAME_ARGS[@]}" "${IVY_EXTRA[@]}" &
pids+=($!)

echo "mesh: $KIND model $MODEL: ivy on $HOST:$PORT, tulip on 127.0.0.1:$TULIP_PORT (metrics" \
  ":$METRICS_PORT), rose on $DEVICE; a crashed tier is restarted; Ctrl-C stops" >&2
# A supervisor ends on its own only when its tier cannot start at all (a flag error).
rc=0
wait -n "${pids[@]}" || rc=$?
echo "mesh: a tier could not be started (status $rc); stopping the mesh" >&2
exit 1
