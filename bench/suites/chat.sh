#!/usr/bin/env bash
# Chat suite: POST /v1/chat/completions with stream=true (SSE) through ivy; time to first token,
# inter-token latency and output tokens/s at 1..64 concurrent streams. Prompts are random words
# (~--lengths tokens, estimated at 0.75 words per token); --max-tokens output tokens each with
# ignore_eos so every stream has the same length.
#   bench/suites/chat.sh --ivy HOST:PORT --out DIR [--streams "1 4 16 64"] [--max-tokens 256]
#                        [common flags, see common.sh]
source "$(dirname "$0")/common.sh"
STREAMS="1 2 4 8 16 32 64" MAXTOK=256
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --streams) STREAMS="$2"; shift 2 ;;
    --max-tokens) MAXTOK="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_suite_flags "${args[@]}"
need ivy
for len in ${LENGTHS:-512}; do
  for c in $STREAMS; do
    n=$(( c * 4 > 16 ? c * 4 : 16 ))
    run_one "$len" --protocol http --endpoint "$IVY" --mode chat --concurrency "$c" \
      --max-tokens "$MAXTOK" --pool 16 $(measure_flags "$n" 0 "$c") --suite chat_streaming \
      --out "$OUT/chat_text${len}_c${c}.json"
  done
done
