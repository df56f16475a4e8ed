#!/usr/bin/env bash
# Chat suite: POST /v1/chat/completions with stream=true (SSE) through ivy; time to first token,
# inter-token latency, time per output token and output tokens/s at 1..64 concurrent streams.
# Prompts are random words calibrated against ivy's /tokenize to --lengths tokens of Harmony
# prompt (system and framing included, i.e. usage.prompt_tokens); --max-tokens output tokens each
# with ignore_eos so every stream has the same length. Every workload's pool holds warm-up + count
# distinct prompts, so no request reuses another's prompt (only the shared Harmony system prefix
# can come from the prefix cache, as in real serving). TTFT is the first content or reasoning delta:
# a random-weight model's first tokens fill the Harmony header (up to ivy's 256-token limit) before
# any delta, so with such a model set SKIP_REASONING=true (the answer starts on the final channel)
# for the engine's TTFT.
#   bench/suites/chat.sh --ivy HOST:PORT --out DIR [--streams "1 2 4 8 16 32 64"]
#                        [--max-tokens 256] [common flags, see common.sh]
# Defaults per workload: count = max(4 x streams, 16) streams measured after `streams` warm-up
# streams; --quick: one measured stream per client after one warm-up stream per client.
source "$(dirname "$0")/common.sh"
STREAMS="1 2 4 8 16 32 64" MAXTOK=256
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --streams) STREAMS="$2"; shift 2 ;;
    --max-tokens) MAXTOK="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_suite_flags "${args[@]}"
need ivy
for len in ${LENGTHS:-512}; do
  for c in $STREAMS; do
    count=$(( c * 4 > 16 ? c * 4 : 16 )) warmup=$c
    # --quick keeps every client busy (count = clients: the concurrency is real, the run short).
    [ "$QUICK" = 1 ] && { count=$c; warmup=$c; }
    [ -n "$COUNT" ] && count="$COUNT"
    [ -n "$WARMUP" ] && warmup="$WARMUP"
    if [ -n "$DURATION" ] && [ "$DURATION" != 0 ]; then
      flags=(--count 0 --duration "$DURATION" --warmup "$warmup")
      pool=$(( warmup + 4 * c ))
    else
      flags=(--count "$count" --duration 0 --warmup "$warmup")
      pool=$(( warmup + count ))
    fi
    run_one "$len" --protocol http --endpoint "$IVY" --mode chat --concurrency "$c" \
      --max-tokens "$MAXTOK" --pool "$pool" "${flags[@]}" --suite chat_streaming \
      ${SKIP_REASONING:+--skip-reasoning "$SKIP_REASONING"} \
      --timeout-ms 600000 --out "$OUT/chat_text${len}_c${c}.json"
  done
done
