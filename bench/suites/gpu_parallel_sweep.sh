#!/usr/bin/env bash
# Issue 19's sweep, the published ROSE table's form: gpt-oss served through the whole mesh (ivy ->
# tulip -> rose) with rose spanning the GPUs of one node in each of several layouts, measuring
#   - prefill latency: one request at a time, a prompt of L tokens, one output token (TTFT, the
#     median of REPS distinct prompts), and its cost per million input tokens at GPU_HOUR_USD per
#     GPU-hour for the layout's GPU count;
#   - decode speed against cost: B concurrent streams with C-token prompts, OUT_DECODE output
#     tokens each: inter-token p50/p99, output tokens/s, cost per million output tokens.
# Writes OUT_DIR/<layout>/{prefill_L,decode_BatC}.json (loadgen's schema), OUT_DIR/sweep.json (one
# row per measurement) and, through bench/suites/parallel_sweep_report.py, OUT_DIR/SWEEP.md (the
# tables beside the published figures) and OUT_DIR/decode_cost.svg (tok/s per stream against
# cost per million output tokens, one line per layout).
#   bench/suites/gpu_parallel_sweep.sh BIN MODEL_DIR TOKENIZER_JSON OUT_DIR
# BIN holds tulip, rose, ivy and loadgen. Environment:
#   LAYOUTS      ';'-separated rose flag sets (default: the published EP sweep with TP = EP:
#                "--ep 1;--tp 2 --ep 2;--tp 4 --ep 4;--tp 8 --ep 8"; "--ep 1" is one GPU). A layout
#                needing more GPUs than are visible is skipped with a line saying so. A layout
#                starting with "disagg" is prefill/decode disaggregation (tulip --disaggregate,
#                the rest of the entry the flags of both roses): on cuda the prefill rose runs on
#                GPU 1, the decode rose on GPU 0 (single-rank roses only; 2 GPUs).
#   PREFILL      prompt lengths (default "8192 32768 65536 131072"); REPS (default 3)
#   DECODE       B@C entries (default "1@8192 16@8192 64@8192 1@32768 16@32768 64@32768");
#                OUT_DECODE output tokens per stream (default 256)
#   DEVICE       cuda (default) or cpu (a dry run of the plumbing on a tiny model)
#   MAX_BATCH_TOKENS (tulip's step budget, default 16384), MAX_MODEL_LEN (rose, default 131072 +
#   1024), TULIP_ARGS / ROSE_ARGS (more flags), GPU_HOUR_USD (default 3), PUBLISHED=120b|20b|none
#   (which published row set SWEEP.md sets beside the figures; default 120b).
set -uo pipefail
BIN=$1 MODEL=$2 TOK=$3 OUT=$4
LAYOUTS=${LAYOUTS:-"--ep 1;--tp 2 --ep 2;--tp 4 --ep 4;--tp 8 --ep 8"}
PREFILL=${PREFILL:-"8192 32768 65536 131072"} REPS=${REPS:-3}
DECODE=${DECODE:-"1@8192 16@8192 64@8192 1@32768 16@32768 64@32768"} GEN=${OUT_DECODE:-256}
DEVICE=${DEVICE:-cuda} MBT=${MAX_BATCH_TOKENS:-16384} MML=${MAX_MODEL_LEN:-132096}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
[ -f "$MODEL/tokenizer.json" ] || cp "$TOK" "$MODEL/tokenizer.json"
gpus=1
if [ "$DEVICE" = cuda ]; then
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
fi
echo "device $DEVICE, $gpus GPU(s) visible"
rows="$OUT/sweep.jsonl"
: > "$rows"
port=50171 hport=8191 mport=9193

# world LAYOUT: GPUs (rank processes) of a rose flag set: tp x dp.
world() {
  local tp=1 dp=1 a prev=""
  for a in $1; do
    [ "$prev" = --tp ] && tp=$a
    [ "$prev" = --dp ] && dp=$a
    prev=$a
  done
  echo $(( tp * dp ))
}

# row JSON_FILE LAYOUT KIND SHAPE GPUS: one line of sweep.jsonl from a loadgen result.
row() {
  python3 - "$@" <<'PY' >> "$rows"
import json, sys
path, layout, kind, shape, gpus = sys.argv[1:6]
try:
    r = json.load(open(path))
except Exception as e:
    print(json.dumps({"layout": layout, "kind": kind, "shape": shape, "gpus": int(gpus),
                      "error": f"no result ({e})"}))
    sys.exit(0)
ch = r.get("chat", {})
req = r.get("requests", {})
print(json.dumps({"layout": layout, "kind": kind, "shape": shape, "gpus": int(gpus),
                  "ok": req.get("ok"), "errors": req.get("errors"),
                  "ttft_ms": ch.get("ttft_ms", {}), "itl_ms": ch.get("itl_ms", {}),
                  "output_tokens_per_s": ch.get("output_tokens_per_s"),
                  "prompt_tokens": r.get("input_tokens", {}).get("per_input_mean"),
                  "wall_s": r.get("duration_s")}))
PY
}

IFS=';' read -r -a layouts <<< "$LAYOUTS"
for layout in "${layouts[@]}"; do
  layout=$(echo "$layout" | xargs)
  disagg=()
  rflags=$layout
  if [ "${layout%% *}" = disagg ]; then
    rflags=${layout#disagg}
    disagg=(--disaggregate)
    [ "$DEVICE" = cuda ] && disagg+=(--prefill-rose-arg=--cuda-device --prefill-rose-arg=1)
  fi
  n=$(world "$rflags")
  [ ${#disagg[@]} -gt 0 ] && n=$(( 2 * n ))
  tag=$(echo "${layout:-single}" | tr -d '-' | tr ' ' '_')
  if [ "$DEVICE" = cuda ] && [ "$n" -gt "$gpus" ]; then
    echo "layout '$layout': $n GPUs needed, $gpus visible: skipped"
    echo "{\"layout\": \"$layout\", \"gpus\": $n, \"skipped\": \"$gpus GPU(s) visible\"}" >> "$rows"
    continue
  fi
  dir="$OUT/$tag"
  mkdir -p "$dir"
  rose_args=()
  for a in $rflags ${ROSE_ARGS:-} --max-model-len "$MML" --max-seqs 64; do
    rose_args+=(--rose-arg "$a")
  done
  "$BIN/tulip" --host 127.0.0.1 --port "$port" --metrics-port "$mport" --model "$MODEL" \
    --device "$DEVICE" --rose-bin "$BIN/rose" --shm-name "/garden-par-sweep-$tag" \
    --served-model-name gpt-oss-sweep --max-num-seqs 64 --max-batch-tokens "$MBT" \
    --progress-timeout-ms 300000 --step-timeout-ms 300000 "${rose_args[@]}" "${disagg[@]}" \
    ${TULIP_ARGS:-} \
    > "$dir/tulip.log" 2>&1 &
  tulip_pid=$!
  "$BIN/ivy" --host 127.0.0.1 --port "$hport" --tulip "127.0.0.1:$port" \
    --tokenizer "$MODEL/tokenizer.json" --served-model-name gpt-oss-sweep > "$dir/ivy.log" 2>&1 &
  ivy_pid=$!
  ready=0
  for _ in $(seq 1 600); do  # every rank loads its shard
    if curl -sf "http://127.0.0.1:$hport/ready" > /dev/null 2>&1; then ready=1; break; fi
    kill -0 "$tulip_pid" 2>/dev/null || break
    sleep 1
  done
  if [ $ready = 0 ]; then
    echo "layout '$layout': the mesh never became ready (see $dir/tulip.log)"
    echo "{\"layout\": \"$layout\", \"gpus\": $n, \"error\": \"not ready\"}" >> "$rows"
    kill -TERM "$ivy_pid" "$tulip_pid" 2>/dev/null
    wait "$ivy_pid" "$tulip_pid" 2>/dev/null
    continue
  fi
  lg() {  # lg OUT_JSON SEQ_LEN MAX_TOKENS CONCURRENCY COUNT SEED
    timeout 1800 "$BIN/loadgen" --protocol http --endpoint "127.0.0.1:$hport" --mode chat \
      --model gpt-oss-sweep --seq-len "$2" --max-tokens "$3" --concurrency "$4" --warmup 0 \
      --count "$5" --pool "$5" --seed "$6" --timeout-ms 1200000 --suite gpu-parallel-sweep \
      --skip-reasoning true --workload "$(basename "$1" .json)" --out "$1" > "${1%.json}.log" 2>&1
  }
  # A warm-up request (graph capture, GEMM tuning) before anything is timed.
  lg "$dir/warmup.json" 512 8 1 1 7
  for L in $PREFILL; do
    lg "$dir/prefill_$L.json" "$L" 1 1 "$REPS" "$(( 100 + L % 997 ))"
    row "$dir/prefill_$L.json" "$layout" prefill "$L" "$n"
    tail -1 "$rows"
  done
  for d in $DECODE; do
    B=${d%@*} C=${d#*@}
    lg "$dir/decode_${B}at$C.json" "$C" "$GEN" "$B" "$B" "$(( 5000 + B + C % 991 ))"
    row "$dir/decode_${B}at$C.json" "$layout" decode "$d" "$n"
    tail -1 "$rows"
  done
  grep -E '"level":"error"' "$dir/tulip.log" "$dir/ivy.log" | head -5
  kill -TERM "$ivy_pid" "$tulip_pid" 2>/dev/null
  wait "$ivy_pid" "$tulip_pid" 2>/dev/null
done
python3 "$ROOT/bench/suites/parallel_sweep_report.py" "$rows" "$OUT" \
  --gpu-hour-usd "${GPU_HOUR_USD:-3}" --published "${PUBLISHED:-120b}"
