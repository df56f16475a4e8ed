#!/usr/bin/env bash
# s30 call 4: [TAG_RMS_FEW_PLAIN] few-row RMSNorm (split vs one warp-wide row with the weight early):
# tests, kernel bench, embedding forward A/B, gpt-oss decode A/B, then the regression suites.
set -uo pipefail
T0=$(date +%s)
tar xJf .carry/all.tar.xz -C /tmp || exit 9
export LD_LIBRARY_PATH=/tmp/gpubin/lib:/usr/local/cuda/lib64
B=/tmp/gpubin
S=$OUT/summary.txt
el() { echo "$(( $(date +%s) - T0 ))s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
$B/gpu_kernels_test --gtest_filter='*RmsNorm*:*QkNormRope*' > $OUT/rms_test.txt 2>&1; echo "rms_test rc=$? $(el)" | tee -a $S
grep -E "OK|FAILED|PASSED|Failure" $OUT/rms_test.txt | head -20
timeout 150 $B/rose_kernel_bench elementwise > $OUT/elem.txt 2>&1; echo "elem rc=$? $(el)" | tee -a $S
grep -E "rms|qk_norm_rope   T=8192|CHECK|fail" $OUT/elem.txt
python3 bench/suites/make_random_qwen3.py --out /tmp/q3emb > /dev/null 2>&1 || echo "mkmodel failed" | tee -a $S
GARDEN_FORWARD_SHAPES=1x128,1x256,1x512,4x128 timeout 150 $B/rose_forward_bench /tmp/q3emb --iters 20 --ab rmssplit,rmsplain,rms64,rmssplit 2>&1 | grep -v 'gemm tuned' > $OUT/fwd_rms_ab.txt; echo "fwd_rms_ab rc=$? $(el)" | tee -a $S
cat $OUT/fwd_rms_ab.txt
python3 bench/suites/make_random_gpt_oss.py --out /tmp/gptoss20b --shape 20b > /dev/null 2>&1 || echo "mk20b failed" | tee -a $S
for r in 1 2; do for v in auto 0; do echo "== [$r] GARDEN_RMS_SPLIT_ROWS=$v"; GARDEN_RMS_SPLIT_ROWS=$v timeout 60 $B/rose_llm_bench --model /tmp/gptoss20b --prefill '' --decode 1@8192,8@4096,64@1024 --decode-steps 32 --max-batch-tokens 16384 2>&1 | grep -v 'gemm tuned' | grep -E '^decode'; done; done > $OUT/llm_rms_ab.txt; echo "llm_rms_ab $(el)" | tee -a $S
cat $OUT/llm_rms_ab.txt
GARDEN_RMS_SPLIT_ROWS=0 $B/gpu_model_graph_test --gtest_brief=1 2>&1 | grep -v 'gemm tuned' > $OUT/model_graph_test.txt; echo "model_graph_test(rms 0) rc=$? $(el)" | tee -a $S
tail -2 $OUT/model_graph_test.txt
cat $S
