#!/usr/bin/env bash
# Suite 3, high throughput: tulip gRPC, pre-tokenized, request batches of 100, four concurrent
# closed-loop clients, 512 / 1024 / 4096 tokens. Goals (one H200): >= 1150 / 550 / 100
# embeddings/s (>= 70% of the bf16 roofline, >= 3x Hugging Face).
#   bench/suites/throughput.sh --tulip HOST:PORT --out DIR [common flags, see common.sh]
source "$(dirname "$0")/common.sh"
parse_suite_flags "$@"
need tulip
for len in ${LENGTHS:-512 1024 4096}; do
  run_one "$len" --protocol grpc --endpoint "$TULIP" --mode embed --batch 100 --concurrency 4 \
    --pool 8 $(measure_flags 0 20 8) --suite high_throughput \
    --out "$OUT/embed_tok${len}_b100_c4.json"
done
