#!/usr/bin/env bash
# Prepared in s33 for the next session's first device call (binaries of .carry/both.commit):
# [TAG_GEMM_TUNE_CHAIN] the GPU tests under GARDEN_GEMM_TUNE_VIEW=chain GARDEN_GEMM_WG=pdl and the
# forward A/B gemmlt, gemmwgpdl, gemmlt+tunechain, gemmwgpdl+tunechain, gemmlt (tuneab). If a
# tunechain variant wins 1x128 by >= 2 %, mesh suites 1-3 with it as "current" against the
# defaults, with the HF compiled peer. Then gemm_smallm and the regression suites as time allows.
set -uo pipefail
START=$(date +%s); TOTAL=${DL:-565}
left() { echo $(( TOTAL - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
tar xJf .carry/both.tar.xz -C /tmp || exit 9
[ -f tests/assets/tokenizers/qwen3/tokenizer.json ] || tar xJf .carry/tok.tar.xz
export LD_LIBRARY_PATH=/tmp/gpubin/lib:/usr/local/cuda/lib64
SESSION_DEADLINE_S=240 bash bench/suites/gpu_llm.sh /tmp/gpubin /tmp/c1 tuneab 2>&1 | grep -v 'gemm tuned' | tail -40
# columns: $2 gemmlt, $3 gemmwgpdl, $4 gemmlt+tunechain, $5 gemmwgpdl+tunechain
CH=$(awk -F'|' '/^1x128 /{best=1.02; pick="";
  split("lt wg", nm, " ");
  for (i = 4; i <= 5; i++) { split($i, f, " "); if (f[2]+0 >= best) { best = f[2]+0; pick = nm[i-3] } }
  print pick}' /tmp/c1/tuneab.txt 2>/dev/null)
cp /tmp/c1/tuneab.txt $OUT/ 2>/dev/null
echo "chosen: '${CH}' ($(left) s left)" | tee $OUT/chosen.txt
ENVV=""
case "$CH" in lt) ENVV="GARDEN_GEMM_TUNE_VIEW=chain";; wg) ENVV="GARDEN_GEMM_TUNE_VIEW=chain GARDEN_GEMM_WG=pdl";; esac
if [ -n "$ENVV" ] && [ $(left) -gt 300 ]; then
  mkdir -p /tmp/bund && ln -sfn /tmp/gpubin /tmp/bund/bin && ln -sfn /tmp/gpubin/lib /tmp/bund/lib
  env $ENVV SESSION_DEADLINE_S=$(( $(left) - 10 )) SESSION_TESTS=0 SESSION_KERNEL_BENCH=0 SESSION_HF_EAGER=0 \
    SESSION_BASELINE_ENV="GARDEN_GEMM_TUNE_VIEW=cold GARDEN_GEMM_WG=0" SESSION_BASELINE_LABEL="defaults (cold tuning, cuBLASLt)" \
    bash bench/suites/gpu_embed_suites.sh /tmp/bund /tmp/gpubin /tmp/mesh 2>&1 | grep -v 'gemm tuned' | tail -40
  find /tmp/mesh -name '*.log' -size +2M -delete; tar czf $OUT/mesh.tgz -C /tmp/mesh .
fi
[ $(left) -gt 60 ] && SESSION_DEADLINE_S=$(( $(left) - 20 )) bash bench/suites/gpu_llm.sh /tmp/gpubin /tmp/c2 gemmsmall regress 2>&1 | grep -v 'gemm tuned' | tail -40
tar czf $OUT/c2.tgz -C /tmp/c2 . 2>/dev/null; tar czf $OUT/c1.tgz -C /tmp/c1 . 2>/dev/null
# at most 6 files come back: gpu.txt chosen.txt tuneab.txt c1.tgz c2.tgz mesh.tgz
echo "done, $(left) s left"
