#!/usr/bin/env bash
# Kernel-level GPU check in ONE device call, no mesh: the tests/gpu binaries, the kernel
# microbenchmarks and the whole-forward bench (small-M GEMM candidate on vs off, the default), then
# compute-sanitizer memcheck of the new kernels' tests. Inputs: GPUBIN from gpu_pack.sh.
#   bench/suites/gpu_kernels_only.sh GPUBIN DEST      (prints a summary; rc = failed steps)
# Env: KTEST_FILTER (gtest filter for the kernels test, default all), MEMCHECK_FILTER.
set -uo pipefail
BIN="$(cd "$1" && pwd)"; DEST="$2"; mkdir -p "$DEST"; DEST="$(cd "$DEST" && pwd)"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
failed=0; summary=""
step() {  # step NAME LIMIT_S CMD...: output to DEST/NAME.txt
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$DEST/$name.txt" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && failed=$((failed + 1))
  summary+="$(printf '%-24s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"$'\n'
  echo "== $name rc=$rc"
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|CHECK FAILED|ERROR SUMMARY|MISMATCH" "$DEST/$name.txt" | head -20
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
step kernels_test 200 "$BIN/gpu_kernels_test" --gtest_filter="${KTEST_FILTER:-*}"
step graph_test 60 "$BIN/gpu_graph_test"
step model_graph_test 120 "$BIN/gpu_model_graph_test"
step kernel_bench 150 "$BIN/rose_kernel_bench"
MODEL=$(mktemp -d)/qwen3-0.6b-random
step make_model 90 python3 "$ROOT/bench/suites/make_random_qwen3.py" --out "$MODEL"
step forward_smallm1 90 env GARDEN_GEMM_SMALLM=1 "$BIN/rose_forward_bench" "$MODEL" --iters 20
step forward 90 "$BIN/rose_forward_bench" "$MODEL" --iters 20
if command -v compute-sanitizer >/dev/null 2>&1; then
  step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/gpu_kernels_test" \
    --gtest_filter="${MEMCHECK_FILTER:-*SmallM*:*AttentionWide*}"
fi
printf "%s" "$summary" | tee "$DEST/summary.txt"
exit $failed
