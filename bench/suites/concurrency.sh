#!/usr/bin/env bash
# Suite 4, high concurrency through ivy: HTTP /v1/embeddings with text (tokenization and the
# ivy -> tulip hop included), ~512 tokens per input (word count calibrated against ivy's
# usage.prompt_tokens, see bench/README.md), batch 1, 1 / 2 / 4 / 8 / 16 concurrent clients.
#   bench/suites/concurrency.sh --ivy HOST:PORT --out DIR [--clients "1 2 4 8 16"] [common flags]
source "$(dirname "$0")/common.sh"
CLIENTS="1 2 4 8 16"
args=()
while [ $# -gt 0 ]; do
  case "$1" in --clients) CLIENTS="$2"; shift 2 ;; *) args+=("$1"); shift ;; esac
done
parse_suite_flags "${args[@]}"
need ivy
for len in ${LENGTHS:-512}; do
  for c in $CLIENTS; do
    run_one "$len" --protocol http --endpoint "$IVY" --mode embed --input text --batch 1 \
      --concurrency "$c" --pool 16 $(measure_flags 0 15 20) --suite high_concurrency \
      --out "$OUT/embed_text${len}_b1_c${c}.json"
  done
done
