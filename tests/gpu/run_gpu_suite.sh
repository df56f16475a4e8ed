#!/usr/bin/env bash
# Runs the GPU suite on a CUDA machine in one go and writes logs under OUT_DIR:
#   gpu.txt        the card as found (nvidia-smi)
#   kernels.log    gpu_kernels_test (every op vs the CPU reference)
#   graph.log      gpu_graph_test (lazy capture, replay == eager, CUDA forward vs CPU)
#   modelgraph.log gpu_model_graph_test (Qwen3 + the step loop through graphs == eager, batch invariance)
#   memcheck.log   compute-sanitizer memcheck over gpu_graph_test and the attention/pool tests
#   bench.txt      rose_kernel_bench (kernel microbenchmarks)
#   e2e.log        make_e2e_reference.py (transformers, bf16) + gpu_e2e_test
#   ipc.log        gpu_ipc_test (two processes on one GPU: IPC all-reduce + KV handoff; named
#                  step only, not in the default list)
# usage: tests/gpu/run_gpu_suite.sh BIN_DIR OUT_DIR [steps...]   (steps: kernels graph modelgraph
#        memcheck bench e2e ipc; default all but ipc). BIN_DIR holds the binaries and lib/ with any shared libraries
#        the host lacks. Exit status: number of failed steps.
set -u
BIN=$(cd "$1" && pwd)
OUT=$2
shift 2
STEPS=${*:-kernels graph modelgraph bench memcheck e2e}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
HERE=$(cd "$(dirname "$0")" && pwd)
failed=0
summary=""
step() {  # step NAME LOG TIMEOUT_S CMD...
  local name=$1 log=$2 limit=$3
  shift 3
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  summary+="$name rc=$rc ${dt}s"$'\n'
  [ $rc -ne 0 ] && failed=$((failed + 1))
  echo "== $name rc=$rc ${dt}s"
  tail -n 15 "$OUT/$log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
cuobjdump --dump-resource-usage "$BIN/rose_kernel_bench" 2>&1 | grep -E "Function|REG" >"$OUT/resources.txt" || true
for s in $STEPS; do
  case $s in
    kernels) step kernels kernels.log 150 "$BIN/gpu_kernels_test" ;;
    graph) step graph graph.log 60 "$BIN/gpu_graph_test" ;;
    modelgraph) step modelgraph modelgraph.log 150 "$BIN/gpu_model_graph_test" ;;
    memcheck) step memcheck memcheck.log 200 bash -c "compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_graph_test' && compute-sanitizer --tool memcheck --error-exitcode 3 '$BIN/gpu_kernels_test' --gtest_filter='*Attention*:*Pool*:*Embedding*:*QkNormRope*:*Swiglu*:*Score*:-AttentionSm90.MatchesReferenceAndMmaSyncKernel'" ;;
    bench) step bench bench.txt 150 "$BIN/rose_kernel_bench" ;;
    e2e) step e2e e2e.log 300 bash -c "PYTHONUNBUFFERED=1 python3 '$HERE/make_e2e_reference.py' --out /tmp/garden_e2e && GARDEN_E2E_DIR=/tmp/garden_e2e '$BIN/gpu_e2e_test'" ;;
    ipc) step ipc ipc.log 600 env NCCL_NVLS_ENABLE=0 "$BIN/gpu_ipc_test" ;;
    *) echo "unknown step $s"; failed=$((failed + 1)) ;;
  esac
done
echo "---- summary"
printf "%s" "$summary" | tee "$OUT/summary.txt"
exit $failed
