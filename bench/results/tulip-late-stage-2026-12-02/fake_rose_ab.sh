#!/usr/bin/env bash
# tulip + fake-rose (sleeping batches: F us + P us/token) + loadgen grpc, 512 tokens, batch 1.
# usage (from the repository root): fake_rose_ab.sh LEAD_US CLIENTS DURATION OUTJSON
set -u
B=${BUILD_DIR:-build}  # run from the repository root
LEAD=$1; C=$2; D=$3; OUT=$4
PORT=$((20000 + RANDOM % 20000))
$B/services/tulip/tulip --port $PORT --metrics-port 0 --model /nonexistent --rose-bin $B/tests/fakes/fake-rose \
  --rose-arg=--step-us --rose-arg=900 --rose-arg=--step-us-per-token --rose-arg=2 \
  --rose-arg=--max-seq-len --rose-arg=512 --stage-lead-us $LEAD --log-level warn \
  --shm-name /garden-hembed-$PORT > ${TMPDIR:-/tmp}/tulip_$PORT.log 2>&1 &
TP=$!
for i in $(seq 100); do
  $B/bench/loadgen/loadgen --endpoint 127.0.0.1:$PORT --seq-len 512 --count 1 --warmup 0 >/dev/null 2>&1 && break
  sleep 0.2
done
$B/bench/loadgen/loadgen --endpoint 127.0.0.1:$PORT --seq-len 512 --concurrency $C --duration $D --warmup 50 --out $OUT >/dev/null 2>&1
rc=$?
kill -TERM $TP; wait $TP 2>/dev/null
python3 - "$OUT" "$LEAD" "$C" <<'PY'
import json,sys
j=json.load(open(sys.argv[1])); l=j["latency_ms"]; t=j["throughput"]
print(f"lead {sys.argv[2]:>5} c{sys.argv[3]:>2}: p50 {l['p50']:.2f} p99 {l['p99']:.2f} ms  {t['items_per_s']:.0f} emb/s  ok {j['requests']['ok']} err {j['requests']['errors']}")
PY
exit $rc
