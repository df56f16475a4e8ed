#!/usr/bin/env bash
# ivy's own cost per request against its thread layout (issue 17): ivy_hop_bench's end-to-end
# piece (the real ivy in front of an instant tulip, a 512-token /v1/embeddings request over one
# keep-alive connection, then 16 at once) for ivy's default io threads, --threads 1/2/4, and ivy
# pinned to two cores (taskset), plus the bare gRPC hop once. Prints the JSON lines of each run
# tagged with the variant, and the thread names of one ivy process (gRPC's "nexting" threads
# scale with the host's cores).
#   bench/suites/ivy_threads.sh BIN_DIR TOKENIZER_JSON [ITERS]
set -u
BIN=$1 TOK=$2 ITERS=${3:-5000}
export LD_LIBRARY_PATH="$BIN/lib:${LD_LIBRARY_PATH:-}"
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
wrap=$(mktemp /tmp/ivy_pinned.XXXX)
printf '#!/bin/sh\nexec taskset -c 0,1 %s "$@"\n' "$BIN/ivy" > "$wrap"
chmod +x "$wrap"
run() {  # run TAG CONNS IVY [IVY ARGS...]
  local tag=$1 conns=$2 ivy=$3; shift 3
  local extra=()
  for a in "$@"; do extra+=(--ivy-arg "$a"); done
  "$BIN/ivy_hop_bench" --tokenizer "$TOK" --iters 10 --grpc-iters 10 --ivy "$ivy" \
    --e2e-iters "$ITERS" --e2e-conns "$conns" "${extra[@]}" 2>/dev/null |
    grep '"ivy_e2e"' | sed "s/^{/{\"variant\":\"$tag\",/"
}
"$BIN/ivy_hop_bench" --tokenizer "$TOK" --iters 1000 --grpc-iters 3000 2>/dev/null | grep '"piece"'
for rep in 1 2; do
  run default 1 "$BIN/ivy"
  run threads1 1 "$BIN/ivy" --threads 1
  run threads2 1 "$BIN/ivy" --threads 2
  run threads4 1 "$BIN/ivy" --threads 4
  run pinned2 1 "$wrap" --threads 2
done
run default 16 "$BIN/ivy"
run threads4 16 "$BIN/ivy" --threads 4
run pinned2 16 "$wrap" --threads 2
# The threads of one ivy with a request served (gRPC creates its callback threads on first use).
"$BIN/ivy_hop_bench" --tokenizer "$TOK" --iters 10 --grpc-iters 10 --ivy "$BIN/ivy" \
  --e2e-iters 200000 >/dev/null 2>&1 &
bench=$!
sleep 3
ivy=$(pgrep -P "$bench" | head -1)
[ -n "$ivy" ] && echo "ivy threads: $(cat /proc/"$ivy"/task/*/comm | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
kill "$bench" 2>/dev/null
wait "$bench" 2>/dev/null
rm -f "$wrap"
