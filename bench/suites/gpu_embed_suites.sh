#!/usr/bin/env bash
# The H200 embedding benchmark in ONE device call, building nothing (replaces the per-session
# scripts; session 2's figures came from its predecessor, session 3's from this one). Inputs,
# both carried from the dev machine:
#   BUNDLE  a release bundle (scripts/bundle.sh with CUDA) with bench/loadgen/loadgen in its bin/
#   GPUBIN  the GPU test binaries and kernel bench (bench/suites/gpu_pack.sh makes it):
#           gpu_kernels_test gpu_graph_test gpu_model_graph_test rose_kernel_bench
#           rose_forward_bench
# Steps (each with a time limit, and all under one budget, SESSION_DEADLINE_S=550 s by default:
# a step that would start past it is skipped and counted as failed):
#   1. tests: every kernel vs the CPU reference (fresh random inputs, poisoned outputs, odd lengths,
#      batch 1, attention variants bit-equal), graph cache, model/engine through graphs == eager,
#      batch invariance (compute-sanitizer memcheck of the attention/pool tests runs last)
#   2. kernel microbenchmarks: attention variants, pooling block vs cluster, GEMMs, elementwise
#   3. a random Qwen3-Embedding-0.6B-shaped checkpoint (make_random_qwen3.py); on it the whole
#      forward without the mesh: eager vs graph, attention auto vs narrow (rose_forward_bench)
#   4. suites 1-3 through the bundle's CUDA mesh, graphs on (--precapture 1x128,1x512,1x4096):
#      first with session 2's kernels (GARDEN_ATTENTION_KERNEL=narrow GARDEN_GEMM_SMALLM=0), then defaults
#   5. the Hugging Face peer (bench/peer/hf_embed_baseline.py) on the same GPU, alone; then the same
#      under torch.compile(mode="reduce-overhead") (CUDA graphs; suites 1 and 3, SESSION_HF_COMPILE=0
#      skips it), whose compiles take minutes: it gets what is left of the budget, up to 240 s
#   Knobs: SESSION_TESTS=0, SESSION_KERNEL_BENCH=0, SESSION_HF_EAGER=0 skip those steps;
#   SESSION_BASELINE_ENV/_LABEL pick the first mesh column, SESSION_FORWARD_ENV the forward A/B.
#   6. reports (render.py) and one comparison table: graphs off vs on vs HF, against the goals
#
#     bench/suites/gpu_embed_suites.sh BUNDLE GPUBIN DEST [--quick]
# Everything (logs, JSON, reports) is written under a work folder and packed at the end (also when
# stopped early) into DEST/session3.tgz; DEST also gets summary.txt, comparison.md,
# kernel_bench.txt and forward_bench.txt (the device tool returns at most 8 files). The last lines printed are the
# summary. Exit status: the number of failed steps (0 = all ran and every check passed).
set -uo pipefail
B="$(cd "$1" && pwd)"; BIN="$(cd "$2" && pwd)"; DEST="$3"; shift 3
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
T="$(mktemp -d)"
OUT="$T/session3"
mkdir -p "$OUT"
finish() {
  tar -czf "$DEST/session3.tgz" -C "$T" session3 2>/dev/null
  for f in summary.txt comparison.md kernel_bench.txt forward_bench.txt; do
    [ -f "$OUT/$f" ] && cp "$OUT/$f" "$DEST/"
  done
}
trap finish EXIT
export LD_LIBRARY_PATH="$BIN/lib:$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
START=$(date +%s)
failed=0
summary=""
note() { summary+="$1"$'\n'; }
DEADLINE=${SESSION_DEADLINE_S:-550}  # whole-script budget (the device call allows 600 s)
step() {  # step NAME LOG LIMIT_S CMD...: runs CMD with a limit, logs to OUT/LOG, records rc
  local name=$1 log=$2 limit=$3
  shift 3
  local t0=$(date +%s)
  local left=$(( DEADLINE - (t0 - START) ))
  if [ $left -lt 15 ]; then
    note "$(printf '%-22s %-28s' "$name" "SKIPPED (session budget spent)")"
    echo "== $name: SKIPPED (session budget spent)"; failed=$((failed + 1)); return
  fi
  [ $limit -gt $left ] && limit=$left
  # bash -c so that exported shell functions (mesh_run) run under the limit too.
  timeout "$limit" bash -c '"$@"' _ "$@" >"$OUT/$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local verdict=ok
  [ $rc -ne 0 ] && { verdict=FAILED; failed=$((failed + 1)); }
  [ $rc -eq 124 ] && verdict="FAILED (timed out after ${limit}s)"
  note "$(printf '%-22s %-28s rc=%-3s %4ss  (%s)' "$name" "$verdict" "$rc" "$dt" "$log")"
  echo "== $name: $verdict rc=$rc ${dt}s (log: $log)"
  [ $rc -ne 0 ] && tail -n 8 "$OUT/$log"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|CHECK FAILED|ERROR SUMMARY|correctness checks failed" "$OUT/$log" | head -20
}

echo "== 0. card"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv 2>&1 | tee "$OUT/gpu.txt"

echo "== 1. tests (tests/gpu)"
# A binary that was not carried (GPUBIN may hold a subset) is skipped and said so.
have() { [ -x "$BIN/$1" ] || { note "$(printf '%-22s %s' "$1" "skipped (not in GPUBIN)")"; return 1; }; }
# SESSION_TESTS=0 skips the tests (a call that only re-measures kernels already checked).
[ "${SESSION_TESTS:-1}" = 1 ] || have() { note "$(printf '%-22s %s' "$1" "skipped (SESSION_TESTS=0)")"; return 1; }
have gpu_kernels_test && step kernels_test tests_kernels.log 120 "$BIN/gpu_kernels_test"
have gpu_graph_test && step graph_test tests_graph.log 40 "$BIN/gpu_graph_test"
have gpu_model_graph_test && step model_graph_test tests_model_graph.log 100 "$BIN/gpu_model_graph_test"

have() { [ -x "$BIN/$1" ] || { note "$(printf '%-22s %s' "$1" "skipped (not in GPUBIN)")"; return 1; }; }
echo "== 2. kernel microbenchmarks"
[ "${SESSION_KERNEL_BENCH:-1}" = 1 ] && have rose_kernel_bench && step kernel_bench kernel_bench.txt 100 "$BIN/rose_kernel_bench" &&
  grep -E "^(attention|attn_|pool)" "$OUT/kernel_bench.txt"

# Rehearsal knobs (a CPU dry run of the script's plumbing on the dev machine):
# SESSION_MODEL=DIR uses that checkpoint, SESSION_DEVICE=cpu, SESSION_MAX_LEN=N (suites' --max-len),
# SESSION_PRECAPTURE= (empty: the cpu backend refuses --precapture).
DEVICE=${SESSION_DEVICE:-cuda}
MAXLEN=${SESSION_MAX_LEN:-0}
if [ -n "${SESSION_MODEL:-}" ]; then
  MODEL="$SESSION_MODEL"
else
  echo "== 3. random 0.6B checkpoint"
  MODEL="$T/qwen3-0.6b-random"
  step make_model make_model.log 90 python3 "$ROOT/bench/suites/make_random_qwen3.py" --out "$MODEL"
fi

if [ -x "$BIN/rose_forward_bench" ]; then
  echo "== 3b. whole forward: eager vs graph, attention auto vs narrow (no mesh)"
  # SESSION_FORWARD_ENV: the environment of the comparison run (default: no small-M GEMM).
  FWD_ENV=${SESSION_FORWARD_ENV:-GARDEN_GEMM_SMALLM=0}
  step forward_bench_alt forward_bench_alt.txt 90 env $FWD_ENV "$BIN/rose_forward_bench" "$MODEL" --iters 20
  step forward_bench forward_bench.txt 90 "$BIN/rose_forward_bench" "$MODEL" --iters 20
  echo "-- $FWD_ENV"; grep -v "^{" "$OUT/forward_bench_alt.txt"
  echo "-- defaults"; grep -v "^{" "$OUT/forward_bench.txt"
fi

# scripts/mesh.sh runs binaries from $BUILD_DIR's layout: point it at the bundle.
FB="$T/build"
source "$ROOT/bench/suites/gpu_mesh.sh"
bundle_build_dir "$B" "$FB"

LAT_COUNT=200 LAT_WARM=20 SC_COUNT=40 TP_COUNT=32 TP4K_COUNT=8
[ $QUICK = 1 ] && { LAT_COUNT=10 LAT_WARM=3 SC_COUNT=5 TP_COUNT=4 TP4K_COUNT=2; }
# suites RUNDIR: suites 1-3 against a running mesh (tulip on :15051).
suites() {
  local d=$1 tp=127.0.0.1:15051
  export BUILD_DIR="$FB" GARDEN_COMMIT="${GARDEN_COMMIT:-session3}"
  local ml="--max-len $MAXLEN"
  "$ROOT/bench/suites/low_latency_embed.sh" --tulip $tp --out "$d" --count $LAT_COUNT --warmup $LAT_WARM $ml &&
    "$ROOT/bench/suites/low_latency_score.sh" --tulip $tp --out "$d" --count $SC_COUNT --warmup 5 $ml &&
    "$ROOT/bench/suites/throughput.sh" --tulip $tp --out "$d" --lengths "512 1024" --count $TP_COUNT --warmup 4 $ml &&
    "$ROOT/bench/suites/throughput.sh" --tulip $tp --out "$d" --lengths 4096 --count $TP4K_COUNT --warmup 4 $ml
}
# mesh_run NAME: starts the bundle's mesh (rose on cuda; env ROSE_* reach rose through tulip),
# waits for it, runs the suites into OUT/NAME, saves rose's graph counters, stops the mesh.
mesh_run() {
  local name=$1
  BUILD_DIR="$FB" "$ROOT/scripts/mesh.sh" --model "$MODEL" --device $DEVICE --port 18080 \
    --tulip-port 15051 --metrics-port 19091 --tulip-arg --queue-limit-tokens=4194304 \
    > "$OUT/mesh_$name.log" 2>&1 &
  local mesh=$!
  echo $mesh > "$OUT/.mesh_pid"  # stop_mesh kills it if this step is timed out
  local ready=0 i
  for i in $(seq 360); do
    python3 -c "import urllib.request as u, sys; sys.exit(u.urlopen('http://127.0.0.1:18080/ready', timeout=2).status != 200)" \
      2>/dev/null && { ready=1; break; }
    kill -0 $mesh 2>/dev/null || break  # the mesh exited
    sleep 0.5
  done
  if [ $ready = 0 ]; then
    echo "mesh not ready; the end of its log:"; tail -20 "$OUT/mesh_$name.log"
    kill -TERM $mesh 2>/dev/null; wait $mesh 2>/dev/null; return 1
  fi
  suites "$OUT/$name"
  local rc=$?
  curl -s http://127.0.0.1:19091/metrics > "$OUT/${name}_tulip_metrics.txt" 2>/dev/null || true
  kill -TERM $mesh 2>/dev/null
  wait $mesh 2>/dev/null
  sleep 1
  grep -E '"msg":"(ready|stopped)"' "$OUT/mesh_$name.log" | grep '"svc":"rose"' | tail -2
  return $rc
}

# After a mesh step (also one killed by its time limit): the mesh must be gone before the next.
stop_mesh() {
  [ -f "$OUT/.mesh_pid" ] || return 0
  local pid i
  pid=$(cat "$OUT/.mesh_pid"); rm -f "$OUT/.mesh_pid"
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL "$pid" 2>/dev/null
}
export -f suites mesh_run
export OUT FB MODEL ROOT LAT_COUNT LAT_WARM SC_COUNT TP_COUNT TP4K_COUNT DEVICE MAXLEN
PRECAPTURE=${SESSION_PRECAPTURE-1x128,1x512,1x4096}  # SESSION_PRECAPTURE= (empty) for cpu
export ROSE_CUDA_GRAPHS=on
[ -n "$PRECAPTURE" ] && export ROSE_PRECAPTURE=$PRECAPTURE
# The first mesh column: SESSION_BASELINE_ENV (default session 2's kernels: narrow attention, no
# small-M GEMM), labelled SESSION_BASELINE_LABEL in comparison.md (e.g. GARDEN_ATTENTION_KERNEL=sm90).
BASE_ENV=${SESSION_BASELINE_ENV:-GARDEN_ATTENTION_KERNEL=narrow GARDEN_GEMM_SMALLM=0}
export BASE_LABEL=${SESSION_BASELINE_LABEL:-session-2 kernels}
if [ "${SESSION_BASELINE:-1}" = 1 ]; then
  echo "== 4a. suites 1-3, graphs on, $BASE_LABEL ($BASE_ENV)"
  step suites_baseline suites_baseline.log 110 env $BASE_ENV bash -c 'mesh_run baseline'
  stop_mesh
fi
echo "== 4b. suites 1-3, graphs on --precapture $PRECAPTURE, current defaults"
step suites_graphs_on suites_graphs_on.log 110 mesh_run graphs_on
stop_mesh
grep -h '"svc":"rose"' "$OUT/suites_graphs_on.log" | tail -2
unset ROSE_CUDA_GRAPHS ROSE_PRECAPTURE

echo "== 5. Hugging Face peer (alone on the GPU)"
PEER_COUNT=10
[ $QUICK = 1 ] && PEER_COUNT=3
export PYTHONUNBUFFERED=1
[ "${SESSION_HF_EAGER:-1}" = 1 ] && step hf_peer peer.log 120 python3 "$ROOT/bench/peer/hf_embed_baseline.py" \
  --out "$OUT/peer" --count $PEER_COUNT --warmup 3
if [ "${SESSION_HF_COMPILE:-1}" = 1 ]; then
  # Each workload's JSON is written as it finishes; --max-seconds stops starting new ones before
  # the step's own limit would kill the run. JSON lines also in peer_compiled.jsonl.
  left=$(( DEADLINE - ($(date +%s) - START) - 20 ))
  [ $left -gt 240 ] && left=240
  step hf_peer_compiled peer_compiled.log 240 bash -c "python3 '$ROOT/bench/peer/hf_embed_baseline.py' \
    --out '$OUT/peer_compiled' --suites 1,3 --compile --count $PEER_COUNT --warmup 3 \
    --max-seconds $(( left > 40 ? left - 30 : 10 )) --jsonl > '$OUT/peer_compiled.jsonl'"
fi

# Last, with what is left of the budget: memcheck over the new kernels' tests.
if command -v compute-sanitizer >/dev/null 2>&1 && [ $QUICK = 0 ] && [ "${SESSION_TESTS:-1}" = 1 ] && [ -x "$BIN/gpu_kernels_test" ]; then
  step memcheck tests_memcheck.log 90 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$BIN/gpu_kernels_test" --gtest_filter="${SESSION_MEMCHECK_FILTER:-*Attention*:*Gemm*}"
else
  note "memcheck               skipped (no compute-sanitizer or --quick)"
fi

echo "== 6. reports"
python3 "$ROOT/bench/render/render.py" --out "$OUT/report_graphs_on" "$OUT/graphs_on" "$OUT/peer" \
  $([ -d "$OUT/peer_compiled" ] && echo "$OUT/peer_compiled") > "$OUT/render.log" 2>&1 || true

python3 - "$OUT" <<'PY' | tee "$OUT/comparison.md"
import glob, json, os, re, sys
out = sys.argv[1]
goals_ms = {"embed_tok128_b1_c1": 1.0, "embed_tok512_b1_c1": 1.5, "embed_tok4096_b1_c1": 12.0}
goals_tp = {"embed_tok512_b100_c4": 1150.0, "embed_tok1024_b100_c4": 550.0, "embed_tok4096_b100_c4": 100.0}
def load(d):
    r = {}
    for f in glob.glob(os.path.join(out, d, "*.json")):
        try:
            j = json.load(open(f))
        except Exception:
            continue
        if j.get("schema") == "garden.bench.result.v1":
            r[j["workload"]] = j
    return r
off, on, hf, hfc = load("baseline"), load("graphs_on"), load("peer"), load("peer_compiled")
def cell(j, tp):
    if not j:
        return "-"
    req = j.get("requests", {})
    err = f" ({req.get('errors')} err)" if req.get("errors") else ""
    if tp:
        return f"{j['throughput']['embeddings_per_s']:.0f} emb/s{err}"
    l = j["latency_ms"]
    return f"{l['p50']:.2f} / {l['p99']:.2f} ms{err}"
def order(n):
    m = re.search(r"tok(\d+)_b(\d+)", n)
    return ("b100" in n, n.split("_")[0], int(m.group(1)) if m else 0, int(m.group(2)) if m else 0)
names = sorted(set(off) | set(on) | set(hf) | set(hfc), key=order)
print(f"| workload | {os.environ.get('BASE_LABEL', 'session-2 kernels')} | current | HF transformers | HF torch.compile | goal |")
print("|---|---|---|---|---|---|")
for n in names:
    tp = "b100" in n
    goal = (f">= {goals_tp[n]:.0f} emb/s" if n in goals_tp else
            f"p50 <= {goals_ms[n]} ms" if n in goals_ms else "")
    print(f"| {n} | {cell(off.get(n), tp)} | {cell(on.get(n), tp)} | {cell(hf.get(n), tp)} | "
          f"{cell(hfc.get(n), tp)} | {goal} |")
print()
print("graphs on in both; latency cells: p50 / p99; throughput cells: embeddings/s (4 clients, batches of 100)")
PY
echo
echo "================ SESSION 3 SUMMARY ($(( $(date +%s) - START ))s) ================"
printf "%s" "$summary" | tee "$OUT/summary.txt"
echo "failed steps: $failed   (details: the named logs inside session3.tgz; comparison.md; report_graphs_*/report.md)"
exit $failed
