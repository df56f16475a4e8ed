#!/usr/bin/env bash
# s33 combined call: [TAG_L2_PREFETCH] tests + forward A/B (pfab); the variant that wins 1x128 by
# >= 3 % (if any) becomes "current" for mesh suites 1-3 against GARDEN_L2_PREFETCH=0 with the HF
# compiled peer; then gemm_smallm (hot / chain / chain+pf columns), the regression suites, and
# ivy_hop_bench on the host's CPUs, as time allows.
set -uo pipefail
START=$(date +%s); TOTAL=${DL:-565}
left() { echo $(( TOTAL - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
tar xJf .carry/both.tar.xz -C /tmp || exit 9
[ -f tests/assets/tokenizers/qwen3/tokenizer.json ] || tar xJf .carry/tok.tar.xz
mkdir -p /tmp/m2; ln -sfn /tmp/gpubin /tmp/m2/gpubin
export LD_LIBRARY_PATH=/tmp/gpubin/lib:/usr/local/cuda/lib64
SESSION_DEADLINE_S=200 bash bench/suites/gpu_llm.sh /tmp/gpubin $OUT/c1 pfab 2>&1 | grep -v 'gemm tuned' | tail -40
# choose: the best of pf1 / pf2 / pf1+pfload at 1x128 if x >= 1.03
CH=$(awk -F'|' '/^1x128 /{best=1.03; pick="";
  split("pf1 pf2 pfload", nm, " ");
  for (i = 3; i <= 5; i++) { split($i, f, " "); if (f[2]+0 >= best) { best = f[2]+0; pick = nm[i-2] } }
  print pick}' $OUT/c1/pfab.txt 2>/dev/null)
echo "chosen: '${CH}' ($(left) s left)" | tee $OUT/chosen.txt
PFENV=""
case "$CH" in pf1) PFENV="GARDEN_L2_PREFETCH=1";; pf2) PFENV="GARDEN_L2_PREFETCH=2";;
  pfload) PFENV="GARDEN_L2_PREFETCH=1 GARDEN_L2_PREFETCH_KIND=load";; esac
GPU=$(cat $OUT/gpu.txt)
run_mesh() {
  mkdir -p /tmp/bund && ln -sfn /tmp/gpubin /tmp/bund/bin && ln -sfn /tmp/gpubin/lib /tmp/bund/lib
  env ${PFENV:-GARDEN_L2_PREFETCH=0} SESSION_DEADLINE_S=$(( $(left) - 10 )) SESSION_TESTS=0 SESSION_KERNEL_BENCH=0 SESSION_HF_EAGER=0 \
    SESSION_BASELINE_ENV="GARDEN_L2_PREFETCH=0" SESSION_BASELINE_LABEL="no weight prefetch (GARDEN_L2_PREFETCH=0)" \
    bash bench/suites/gpu_embed_suites.sh /tmp/bund /tmp/gpubin $OUT/mesh 2>&1 | grep -v 'gemm tuned' | tail -40
}
hop() {
  for c in 1 16; do
    timeout 40 /tmp/m2/gpubin/ivy_hop_bench --tokenizer tests/assets/tokenizers/qwen3/tokenizer.json \
      --iters 2000 --grpc-iters 5000 --ivy /tmp/m2/gpubin/ivy --e2e-iters 4000 --e2e-conns $c > $OUT/ivy_hop_c$c.jsonl 2>&1
    grep -h 'grpc_hop_tcp\|ivy_e2e' $OUT/ivy_hop_c$c.jsonl
  done
}
# mesh first when a variant won, or on an H200 (the card, never measured with the peer)
if [ -n "$PFENV" ] || echo "$GPU" | grep -q H200; then
  [ $(left) -gt 300 ] && run_mesh
fi
[ $(left) -gt 60 ] && SESSION_DEADLINE_S=$(( $(left) - 40 )) bash bench/suites/gpu_llm.sh /tmp/gpubin $OUT/c2 gemmsmall regress 2>&1 | grep -v 'gemm tuned' | tail -60
[ $(left) -gt 25 ] && hop
echo "done, $(left) s left"
