#!/usr/bin/env bash
# s31 call 1: [TAG_GEMM_WG] tests + forward A/B + tuning lines, the elementwise bench, the
# few-row RMSNorm A/B (embedding forward + gpt-oss decode), the regression suites, then an ncu
# profile of the forward with the Hopper GEMM among the candidates.
set -o pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
tar xJf .carry/all.tar.xz -C /tmp || exit 9
export LD_LIBRARY_PATH=/tmp/gpubin/lib:/usr/local/cuda/lib64
SESSION_DEADLINE_S=${DL:-470} bash bench/suites/gpu_llm.sh /tmp/gpubin $OUT ${STEPS:-gemmwgab elem mk20b rmsab regress} 2>&1 | grep -v 'gemm tuned' | tail -120
GARDEN_GEMM_WG=1 timeout 100 bash bench/suites/gpu_profile.sh /tmp/gpubin $OUT/embprofwg 1x128 1x512 2>&1 | grep -v 'gemm tuned' | tail -30
