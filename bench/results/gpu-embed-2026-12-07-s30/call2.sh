#!/usr/bin/env bash
# s30 call 2: mesh suites 1-3 (graphs on, bf16) with the legacy QK kernel as the baseline column,
# the defaults (pair kernel) as current, and HF transformers + torch.compile on the same GPU.
set -uo pipefail
tar xJf .carry/mesh.tar.xz -C /tmp || exit 9
mkdir -p /tmp/bund && ln -sfn /tmp/gpubin /tmp/bund/bin && ln -sfn /tmp/gpubin/lib /tmp/bund/lib
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
SESSION_DEADLINE_S=${DL:-560} SESSION_TESTS=0 SESSION_KERNEL_BENCH=0 SESSION_HF_EAGER=0 \
SESSION_BASELINE_ENV="GARDEN_QK_ROPE=legacy" SESSION_BASELINE_LABEL="legacy qk_norm_rope" \
  bash bench/suites/gpu_embed_suites.sh /tmp/bund /tmp/gpubin $OUT 2>&1 | grep -v 'gemm tuned' | tail -60
