#!/usr/bin/env bash
# Chat serving through the whole mesh on the GPU host (issue 16's serving table): tulip spawning
# rose --device cuda on a gpt-oss checkpoint, ivy with the real o200k_harmony tokenizer, and
# loadgen (HTTP, streamed chat, ignore_eos) driving ivy with closed-loop clients:
#   - 1k prompt / 1k output tokens at 1, 16, 64 and 256 concurrent streams: TTFT and inter-token
#     latency p50/p99 (from the SSE events), output tokens/s;
#   - the same at --saturate concurrency (default 256) for the saturated throughput row.
#     bench/suites/gpu_chat_sweep.sh GPUBIN MODEL_DIR TOKENIZER_JSON OUT_DIR [CONCURRENCIES]
# Writes OUT_DIR/chat_c<N>.json (loadgen's schema, bench/README.md) and prints one line per run.
# Every request of a run has a prompt of its own (--pool = the request count, a seed per
# concurrency), so no run is served from the prefix cache of another request's prompt (POOL=32
# gives the old behavior: 32 prompts cycled, i.e. 7 of 8 requests at 256 streams hit the cache).
# Environment: PROMPT_TOKENS / OUTPUT_TOKENS (1024 each), POOL, SEED (base; default 1000),
# MAX_BATCH_TOKENS (tulip's step budget, default 8192), RESPONSE_FORMAT=json_object (structured
# outputs: every request constrained; the line then also gives tulip's mask counters),
# SKIP_REASONING=true (answers start on the final channel: with RESPONSE_FORMAT every token is
# constrained), TEMPERATURE=0 (greedy: runs of the same prompts give the same tokens, so A/B runs
# decode the same sequences), TULIP_ARGS (more tulip flags, e.g. --mask-threads 0), TAG (an
# output suffix), RESPONSE_SCHEMA (a JSON Schema file: RESPONSE_FORMAT=json_schema with it;
# bench/suites/schemas/long_arrays.json asks for 4 x 128 integers, at least 512 tokens, so a
# constrained run keeps its whole batch to the end, unlike json_object whose values end early),
# MAX_NUM_SEQS (the running set: tulip --max-num-seqs and rose --max-seqs; default 256, the
# most a concurrency above it gets at once), REQS_PER_CLIENT (requests per client from 4 streams
# up; default 1: one wave, every stream starting together; 2 and more also measure the mixed
# prefill/decode steps of clients that come back while others decode).
MAXSEQS=${MAX_NUM_SEQS:-256} RPC=${REQS_PER_CLIENT:-1}
set -uo pipefail
BIN=$1 MODEL=$2 TOK=$3 OUT=$4
CONC=${5:-"1 16 64 256"}
PROMPT=${PROMPT_TOKENS:-1024} GEN=${OUTPUT_TOKENS:-1024}
RF=${RESPONSE_FORMAT:-none} TAG=${TAG:-}
mkdir -p "$OUT"
[ -f "$MODEL/tokenizer.json" ] || cp "$TOK" "$MODEL/tokenizer.json"
"$BIN/tulip" --host 127.0.0.1 --port 50161 --metrics-port 9192 --model "$MODEL" --device cuda \
  --rose-bin "$BIN/rose" --shm-name /garden-gpu-sweep --served-model-name gpt-oss-gpu \
  --max-num-seqs "$MAXSEQS" --rose-arg --max-seqs --rose-arg "$MAXSEQS" \
  --max-batch-tokens "${MAX_BATCH_TOKENS:-8192}" --progress-timeout-ms 120000 \
  --step-timeout-ms 120000 ${TULIP_ARGS:-} > "$OUT/sweep_tulip$TAG.log" 2>&1 &
tulip_pid=$!
"$BIN/ivy" --host 127.0.0.1 --port 8182 --tulip 127.0.0.1:50161 --tokenizer "$MODEL/tokenizer.json" \
  --served-model-name gpt-oss-gpu > "$OUT/sweep_ivy$TAG.log" 2>&1 &
ivy_pid=$!
cleanup() { kill -TERM "$ivy_pid" "$tulip_pid" 2>/dev/null; wait "$ivy_pid" "$tulip_pid" 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq 1 120); do  # rose loads the checkpoint: wait until ivy serves the model
  curl -sf http://127.0.0.1:8182/ready > /dev/null 2>&1 && break
  sleep 1
done
rc=0
for c in $CONC; do
  n=$(( c < 4 ? 3 : c * RPC ))
  timeout $(( 240 * RPC )) "$BIN/loadgen" --protocol http --endpoint 127.0.0.1:8182 --mode chat \
    --model gpt-oss-gpu --seq-len "$PROMPT" --max-tokens "$GEN" --concurrency "$c" \
    --warmup 0 --count "$n" --pool "${POOL:-$n}" --seed "$(( ${SEED:-1000} + c ))" \
    --timeout-ms 200000 --suite gpu-chat-sweep --response-format "$RF" \
    ${RESPONSE_SCHEMA:+--response-schema "$RESPONSE_SCHEMA"} \
    --skip-reasoning "${SKIP_REASONING:-false}" --temperature "${TEMPERATURE:--1}" \
    --workload "chat_in${PROMPT}_out${GEN}_c${c}_rf_$RF" --out "$OUT/chat_c$c$TAG.json" \
    > "$OUT/chat_c$c$TAG.log" 2>&1 || rc=1
  python3 - "$OUT/chat_c$c$TAG.json" "$c" "$RF" "$TAG" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"c={sys.argv[2]}: no result ({e})"); sys.exit(0)
ch = r.get("chat", {})
pick = lambda s: {k: round(s.get(k, 0), 2) for k in ("p50", "p99")} if s else {}
print(json.dumps({"concurrency": int(sys.argv[2]), "response_format": sys.argv[3], "tag": sys.argv[4],
                  "ok": r.get("requests", {}).get("ok"),
                  "errors": r.get("requests", {}).get("errors"),
                  "prompt_tokens": r.get("input_tokens", {}).get("per_input_mean"),
                  "output_tokens": ch.get("output_tokens"),
                  "output_tokens_per_s": round(ch.get("output_tokens_per_s", 0), 1),
                  "ttft_ms": pick(ch.get("ttft_ms")), "itl_ms": pick(ch.get("itl_ms")),
                  "wall_s": round(r.get("duration_s", 0), 2)}))
PY
done
curl -s http://127.0.0.1:9192/metrics > "$OUT/sweep_tulip_metrics$TAG.txt" 2>/dev/null
grep -E '^tulip_(llm_mask|llm_masked|llm_late_mask|generated_tokens_total|llm_step_seconds_(sum|count))' \
  "$OUT/sweep_tulip_metrics$TAG.txt"
grep -E '"level":"(error|warn)"' "$OUT/sweep_tulip$TAG.log" "$OUT/sweep_ivy$TAG.log" | head -10
exit $rc
