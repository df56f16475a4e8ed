#!/usr/bin/env bash
# Where the forward's GPU time goes: Nsight Compute (hardware-timed, clocks left alone) over the
# second eager forward pass (the first tunes the GEMMs) of rose_forward_bench at each shape,
# summed by kernel family.
#   bench/suites/gpu_profile.sh GPUBIN OUT [SHAPES...]     (GPUBIN from bench/suites/gpu_pack.sh)
set -uo pipefail
BIN="$(cd "$1" && pwd)"; OUT="$2"; shift 2
SHAPES=("$@"); [ ${#SHAPES[@]} -eq 0 ] && SHAPES=(1x128 1x512 1x4096)
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
mkdir -p "$OUT"
T="$(mktemp -d)"
timeout 90 python3 "$ROOT/bench/suites/make_random_qwen3.py" --out "$T/m" > "$OUT/make_model.log" 2>&1 || { echo "model failed"; tail "$OUT/make_model.log"; exit 1; }
for s in "${SHAPES[@]}"; do
  # The profiled kernels are the second eager pass of this shape (warm-up 2 of 2, between
  # cudaProfilerStart/Stop): the first one tunes the GEMMs (GARDEN_GEMM_TUNE=0 turns tuning off).
  GARDEN_FORWARD_SHAPES="$s" timeout 200 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
    --csv --launch-count 420 "$BIN/rose_forward_bench" "$T/m" --iters 3 > "$OUT/ncu_$s.csv" 2> "$OUT/ncu_$s.err"
  echo "== $s: ncu rc=$?"
  python3 "$ROOT/bench/suites/ncu_summary.py" "$OUT/ncu_$s.csv" | tee "$OUT/profile_$s.txt"
done
