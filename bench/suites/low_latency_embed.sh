#!/usr/bin/env bash
# Suite 1, low-latency embedding: tulip gRPC, pre-tokenized, batch 1, one strictly sequential
# client, 128 / 512 / 4096 tokens. Goals (one H200): p50 <= 1.0 / 1.5 / 12 ms, p99 <= 1.3 x p50.
#   bench/suites/low_latency_embed.sh --tulip HOST:PORT --out DIR [common flags, see common.sh]
source "$(dirname "$0")/common.sh"
parse_suite_flags "$@"
need tulip
for len in ${LENGTHS:-128 512 4096}; do
  run_one "$len" --protocol grpc --endpoint "$TULIP" --mode embed --batch 1 --concurrency 1 \
    $(measure_flags 2000 0 200) --suite low_latency_embedding \
    --out "$OUT/embed_tok${len}_b1_c1.json"
done
