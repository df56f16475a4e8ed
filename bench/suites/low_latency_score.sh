#!/usr/bin/env bash
# Suite 2, low-latency scoring: tulip gRPC Score (reranker style: yes/no logits, or the
# classification head when the checkpoint has one), pre-tokenized, one sequential client,
# batches of 5 / 25 / 50 at 512 tokens.
#   bench/suites/low_latency_score.sh --tulip HOST:PORT --out DIR [common flags, see common.sh]
source "$(dirname "$0")/common.sh"
parse_suite_flags "$@"
need tulip
for len in ${LENGTHS:-512}; do
  for b in 5 25 50; do
    run_one "$len" --protocol grpc --endpoint "$TULIP" --mode score --batch "$b" --concurrency 1 \
      $(measure_flags 500 0 50) --suite low_latency_scoring \
      --out "$OUT/score_tok${len}_b${b}_c1.json"
  done
done
