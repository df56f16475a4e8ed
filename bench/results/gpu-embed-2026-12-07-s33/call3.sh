#!/usr/bin/env bash
# s33 call 3: suite 4 through ivy (512 tokens, batch 1, 1..16 clients) and mesh suites 1-3 with the
# current defaults beside HF transformers + torch.compile, H100; results tarred (file-count limit).
set -uo pipefail
R=/tmp/res; mkdir -p $R
[ -x /tmp/gpubin/rose ] || tar xJf .carry/both.tar.xz -C /tmp
[ -f tests/assets/tokenizers/qwen3/tokenizer.json ] || tar xJf .carry/tok.tar.xz
mkdir -p /tmp/bund && ln -sfn /tmp/gpubin /tmp/bund/bin && ln -sfn /tmp/gpubin/lib /tmp/bund/lib
export LD_LIBRARY_PATH=/tmp/gpubin/lib:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
echo "== suite 4"
timeout 150 bash bench/suites/gpu_suite4.sh /tmp/bund tests/assets/tokenizers/qwen3/tokenizer.json $R/suite4 --duration 5 2>&1 | grep -v 'gemm tuned' | tail -25
SESSION_DEADLINE_S=${DL:-300} SESSION_BASELINE=0 SESSION_TESTS=0 SESSION_KERNEL_BENCH=0 SESSION_HF_EAGER=0 \
  bash bench/suites/gpu_embed_suites.sh /tmp/bund /tmp/gpubin $R/mesh 2>&1 | grep -v 'gemm tuned' | tail -40
cat $R/mesh/comparison.md 2>/dev/null | head -40
find $R -name '*.log' -size +2M -delete
tar czf $OUT/res.tgz -C $R .
